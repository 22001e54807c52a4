"""Moving page bundles and state images between device memory and host slabs (spec §6.5, §7.6, §11.2).

Copies are enqueued on a backend stream as strided 2-D copies: one per plane per coalesced run of pages
(`copy_plan.plan_page_runs`), and one per image segment. A restore is enqueued in the order a forward
pass reads it — the prelude (snapshot tail pages), then layer by layer (a full-attention layer's K/V
planes of every restored block, or a linear-attention layer's conv and recurrent state) — with an event
after the prelude and after each layer, so the first prefill pass can wait per layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from hybridcache.cache.ids import PageId, SlabId, SlotId
from hybridcache.gpu.backend import DeviceEvent, Stream
from hybridcache.gpu.copy_plan import PageRun, plan_image_segments, plan_page_runs
from hybridcache.gpu.host_tier import HostSlabMemory
from hybridcache.gpu.kv_pool import KvPools, flat_bytes
from hybridcache.gpu.state_slots import StateSlots


class ImageCopy(NamedTuple):
    slot: SlotId
    slabs: tuple[SlabId, ...]


class RestoreTicket(NamedTuple):
    """Events of one restore batch: after the prelude, after each layer's part, and after everything."""

    prelude: DeviceEvent
    layers: dict[int, DeviceEvent]
    done: DeviceEvent


class Transfers:
    """Enqueues copies between `kv`/`states` and `memory`. Mutates only the destination bytes."""

    def __init__(self, kv: KvPools, states: StateSlots, memory: HostSlabMemory) -> None:
        self.kv = kv
        self.states = states
        self.memory = memory
        self._plane_parts = list(zip(kv.page_parts, kv.planes()))
        self._image_parts = list(zip(states.image_parts, states.planes()))

    # -- device -> host (write-through) ---------------------------------------------------------
    def write_pages(self, stream: Stream, pairs: Sequence[tuple[PageId, SlabId]]) -> None:
        """Enqueue D2H copies of whole page bundles into their slabs."""
        for run in plan_page_runs(pairs, self.memory.location):
            self._copy_run(stream, run, self._plane_parts, to_host=True)

    def write_image(self, stream: Stream, image: ImageCopy) -> None:
        """Enqueue the D2H copy of slot `image.slot` into `image.slabs`."""
        self._copy_image(stream, image, range(len(self._image_parts)), to_host=True)

    # -- host -> device (restore) ---------------------------------------------------------------
    def restore(
        self,
        stream: Stream,
        pages: Sequence[tuple[PageId, SlabId]],
        tail_pages: Sequence[tuple[PageId, SlabId]] = (),
        image: ImageCopy | None = None,
    ) -> RestoreTicket:
        """Enqueue a restore batch in forward order with an event per part. Returns the ticket."""
        for run in plan_page_runs(tail_pages, self.memory.location):
            self._copy_run(stream, run, self._plane_parts, to_host=False)
        prelude = stream.record_event()
        runs = plan_page_runs(pages, self.memory.location)
        layer_events: dict[int, DeviceEvent] = {}
        for layer in sorted(set(self.kv.layers) | set(self.states.layers)):
            planes = [(part, plane) for part, plane in self._plane_parts if part.layer == layer]
            for run in runs:
                self._copy_run(stream, run, planes, to_host=False)
            if image is not None:
                indices = [i for i, (part, _) in enumerate(self._image_parts) if part.layer == layer]
                self._copy_image(stream, image, indices, to_host=False)
            layer_events[layer] = stream.record_event()
        return RestoreTicket(prelude, layer_events, stream.record_event())

    # -- helpers ----------------------------------------------------------------------------------
    def _copy_run(self, stream: Stream, run: PageRun, planes, to_host: bool) -> None:
        host = self.memory.chunk(run.chunk)
        host_pitch = run.host_pitch or self.memory.slab_bytes
        for part, plane in planes:
            device = flat_bytes(plane)
            device_offset = run.first_page * part.nbytes
            host_offset = run.host_offset + part.offset
            if to_host:
                stream.copy_2d(
                    host, host_offset, host_pitch, device, device_offset, part.nbytes, part.nbytes, run.count
                )
            else:
                stream.copy_2d(
                    device, device_offset, part.nbytes, host, host_offset, host_pitch, part.nbytes, run.count
                )

    def _copy_image(self, stream: Stream, image: ImageCopy, indices, to_host: bool) -> None:
        sizes = [part.nbytes for part, _ in self._image_parts]
        wanted = set(indices)
        for segment in plan_image_segments(sizes, image.slabs, self.memory.slab_bytes):
            if segment.part_index not in wanted:
                continue
            _, plane = self._image_parts[segment.part_index]
            device = flat_bytes(plane[image.slot])
            chunk, slab_offset = self.memory.location(segment.slab)
            host = self.memory.chunk(chunk)
            host_offset = slab_offset + segment.slab_offset
            n = segment.nbytes
            if to_host:
                stream.copy_2d(host, host_offset, n, device, segment.part_offset, n, n, 1)
            else:
                stream.copy_2d(device, segment.part_offset, n, host, host_offset, n, n, 1)
