"""Page bundles and state images through host slabs: bit-exact round trips, per-layer restore events."""

import pytest
import torch

from hybridcache.cache.ids import PageId, SlabId, SlotId
from hybridcache.cache.slab_pool import HostSlabPool, slab_bytes_for
from hybridcache.gpu.backend import CpuStream
from hybridcache.gpu.host_tier import HostAllocationError, HostSlabMemory
from hybridcache.gpu.kv_pool import KvPools
from hybridcache.gpu.state_slots import StateShape, StateSlots
from hybridcache.gpu.transfers import ImageCopy, Transfers

FULL_LAYERS = (3, 7)
LINEAR_LAYERS = (0, 1, 2, 4, 5, 6)


def filled(tensor: torch.Tensor, generator: torch.Generator) -> None:
    tensor.copy_(torch.randn(tensor.shape, generator=generator).to(tensor.dtype))


@pytest.fixture(params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def device_memory(request):
    generator = torch.Generator().manual_seed(7)
    kv = KvPools(FULL_LAYERS, num_pages=16, kv_heads=2, head_dim=8, dtype=request.param)
    states = StateSlots(
        LINEAR_LAYERS, num_slots=4, shape=StateShape(24, 3, 2, 8, 8), conv_dtype=request.param
    )
    for plane in kv.planes() + states.planes():
        filled(plane, generator)
    return kv, states


@pytest.fixture
def stream():
    created = CpuStream("transfer")
    yield created
    created.close()


def host_for(kv: KvPools, states: StateSlots, slabs: int = 40, chunk_slabs: int = 3) -> HostSlabMemory:
    slab_bytes = slab_bytes_for(kv.plane_page_bytes)
    pool = HostSlabPool(slab_bytes, slabs * slab_bytes, chunk_bytes=chunk_slabs * slab_bytes)
    return HostSlabMemory(pool)


def page_bytes(kv: KvPools, page: int) -> list[bytes]:
    return [plane[page].contiguous().view(torch.uint8).numpy().tobytes() for plane in kv.planes()]


def slot_bytes(states: StateSlots, slot: int) -> list[bytes]:
    return [plane[slot].contiguous().view(torch.uint8).numpy().tobytes() for plane in states.planes()]


def test_pages_round_trip_through_slabs_across_chunks(device_memory, stream):
    kv, states = device_memory
    transfers = Transfers(kv, states, host_for(kv, states))
    sources = [PageId(p) for p in (0, 1, 2, 3, 9)]
    slabs = [SlabId(s) for s in (1, 2, 3, 4, 20)]  # crosses a chunk boundary (3 slabs per chunk)
    expected = [page_bytes(kv, p) for p in sources]
    transfers.write_pages(stream, list(zip(sources, slabs)))
    stream.record_event().wait_blocking()
    targets = [PageId(p) for p in (10, 11, 12, 13, 15)]
    ticket = transfers.restore(stream, list(zip(targets, slabs)))
    ticket.done.wait_blocking()
    assert [page_bytes(kv, p) for p in targets] == expected


def test_a_state_image_round_trips_bit_exactly(device_memory, stream):
    kv, states = device_memory
    memory = host_for(kv, states)
    transfers = Transfers(kv, states, memory)
    count = memory.pool.image_slab_count(states.image_bytes)
    image_slabs = tuple(SlabId(s) for s in range(30, 30 + count))
    expected = slot_bytes(states, 1)
    transfers.write_image(stream, ImageCopy(SlotId(1), image_slabs))
    stream.record_event().wait_blocking()
    ticket = transfers.restore(stream, [], image=ImageCopy(SlotId(3), image_slabs))
    ticket.done.wait_blocking()
    assert slot_bytes(states, 3) == expected


def test_a_restore_records_the_prelude_and_one_event_per_layer_in_forward_order(device_memory):
    kv, states = device_memory
    transfers = Transfers(kv, states, host_for(kv, states))
    recorded: list[str] = []

    class RecordingStream:
        name = "recording"

        def copy_2d(self, dst, dst_offset, dst_pitch, src, src_offset, src_pitch, width, rows):
            recorded.append("copy")

        def record_event(self):
            recorded.append("event")
            return object()

    ticket = transfers.restore(
        RecordingStream(),
        [(PageId(4), SlabId(0)), (PageId(5), SlabId(1))],
        tail_pages=[(PageId(8), SlabId(5))],
        image=ImageCopy(SlotId(0), tuple(SlabId(s) for s in range(10, 20))),
    )
    assert list(ticket.layers) == sorted(FULL_LAYERS + LINEAR_LAYERS)
    # prelude: the tail's 4 planes, then its event
    assert recorded[:5] == ["copy"] * 4 + ["event"]
    # every layer ends with its own event, and full-attention layers copy K and V as one run each
    per_layer = "".join("c" if r == "copy" else "|" for r in recorded[5:]).split("|")[:-1]
    assert len(per_layer) == len(FULL_LAYERS + LINEAR_LAYERS) + 1  # + the final 'done' event
    assert per_layer[3] == "cc" and per_layer[7] == "cc"


def test_a_failed_host_allocation_names_its_size():
    def refuse(nbytes: int) -> torch.Tensor:
        raise RuntimeError("out of memory")

    pool = HostSlabPool(4096, 10 * 4096)
    with pytest.raises(HostAllocationError, match="MiB of host slab memory"):
        HostSlabMemory(pool, allocate=refuse).slab_view(SlabId(0))


def test_chunks_are_allocated_only_when_used():
    pool = HostSlabPool(4096, 100 * 4096, chunk_bytes=10 * 4096)
    memory = HostSlabMemory(pool)
    assert memory.allocated_bytes == 0
    memory.slab_view(SlabId(35))
    assert memory.allocated_bytes == 10 * 4096
