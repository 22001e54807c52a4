"""KV pools and state slots: byte layouts, copies, and the state-image round trip restores depend on."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_testkit import Lane, fresh_memory, prompt_tokens

from hybridcache.cache.ids import BLOCK_TOKENS, PageId, SlotId
from hybridcache.gpu.kv_pool import KvPools, pages_for_tokens
from hybridcache.gpu.model.tolerance import CHUNK_DECOMPOSITION_RTOL
from hybridcache.gpu.state_slots import TAIL_ROWS, StateShape, StateSlots


def assert_parts_tile_the_image(parts, total: int) -> None:
    offset = 0
    for part in parts:
        assert part.offset == offset, f"{part.name} does not follow the previous part"
        assert part.nbytes > 0
        offset += part.nbytes
    assert offset == total


def test_state_image_parts_are_named_byte_ranges_in_forward_order(dense_model):
    states = dense_model.new_state_slots(2)
    config = dense_model.config
    layers = [part.layer for part in states.image_parts]
    assert layers == sorted(layers) and set(layers) == set(config.linear_attention_layers)
    assert [part.name for part in states.image_parts[:4]] == [
        "layer0.conv", "layer0.recurrent", "layer0.tail_rows", "layer0.tail_count"
    ]
    conv_bytes = config.conv_dim * (config.linear_conv_kernel_dim - 1) * 4
    recurrent_bytes = (
        config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * 4
    )
    tail_bytes = TAIL_ROWS * config.hidden_size * 4 + 4  # the layer inputs of a pending tail, and its count
    assert [part.nbytes for part in states.image_parts[:4]] == [
        conv_bytes, recurrent_bytes, tail_bytes - 4, 4
    ]
    assert_parts_tile_the_image(states.image_parts, states.image_bytes)
    layers = len(config.linear_attention_layers)
    assert states.image_bytes == layers * (conv_bytes + recurrent_bytes + tail_bytes)
    assert states.tail_bytes() == layers * tail_bytes


def test_page_bundle_layout_covers_k_and_v_of_every_attention_layer(dense_model):
    kv = dense_model.new_kv_pools(3)
    config = dense_model.config
    plane_bytes = BLOCK_TOKENS * config.num_key_value_heads * config.head_dim * 4
    assert kv.plane_page_bytes == [plane_bytes] * (2 * len(config.full_attention_layers))
    assert [part.name for part in kv.page_parts] == [
        f"layer{i}.{kind}" for i in config.full_attention_layers for kind in ("k", "v")
    ]
    assert_parts_tile_the_image(kv.page_parts, kv.page_bytes)
    assert kv.k_planes[0].shape == (3, BLOCK_TOKENS, config.num_key_value_heads, config.head_dim)


def test_recurrent_state_is_fp32_even_in_bf16():
    shape = StateShape(conv_dim=8, conv_width=3, value_heads=2, key_head_dim=4, value_head_dim=4)
    states = StateSlots([0, 2], 3, shape, torch.bfloat16)
    assert states.conv_planes[0].dtype == torch.bfloat16
    assert all(plane.dtype == torch.float32 for plane in states.recurrent_planes)
    assert states.image_bytes == 2 * (8 * 3 * 2 + 2 * 4 * 4 * 4 + 4)  # no tail rows without a tail width


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_exported_pages_import_byte_for_byte(data):
    kv = KvPools([3, 7], num_pages=6, kv_heads=2, head_dim=4, dtype=torch.bfloat16)
    for plane in kv.planes():
        plane.copy_(torch.randn(plane.shape))
    sources = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=3, unique=True))
    targets = data.draw(st.permutations(range(6)))[: len(sources)]
    before = [plane.clone() for plane in kv.planes()]
    kv.import_pages([PageId(t) for t in targets], kv.export_pages([PageId(s) for s in sources]))
    for plane, old in zip(kv.planes(), before):
        for source, target in zip(sources, targets):
            assert torch.equal(plane[target], old[source])
        untouched = [p for p in range(6) if p not in targets]
        assert torch.equal(plane[untouched], old[untouched])


def test_import_rejects_the_wrong_number_of_bytes(dense_model):
    states = dense_model.new_state_slots(1)
    kv = dense_model.new_kv_pools(1)
    for action in (
        lambda: states.import_slot(SlotId(0), b"\0" * (states.image_bytes - 1)),
        lambda: kv.import_pages([PageId(0)], b"\0" * (kv.page_bytes + 1)),
    ):
        try:
            action()
        except ValueError:
            continue
        raise AssertionError("a short or long buffer was accepted")


def test_copy_slot_and_reset_slot(dense_model):
    memory = fresh_memory(dense_model)
    lane = memory.lanes(1, 1)[0]
    dense_model.prefill(prompt_tokens(20), 0, lane.table, lane.slot, memory.kv, memory.states)
    image = memory.states.export_slot(lane.slot)
    memory.states.copy_slot(lane.slot, SlotId(0))
    assert memory.states.export_slot(SlotId(0)) == image
    dense_model.reset_slot(memory.states, SlotId(0))
    assert memory.states.export_slot(SlotId(0)) == bytes(memory.states.image_bytes)


def test_state_image_round_trip_continues_bit_identically(dense_model):
    """Copy a lane's slot and pages out to bytes, into another slot and other pages; decoding both lanes
    from there gives bit-identical logits."""
    tokens = prompt_tokens(150, seed=9)
    memory = fresh_memory(dense_model, num_pages=12, num_slots=4)
    original = Lane([PageId(p) for p in (5, 1, 8)], SlotId(2))
    dense_model.prefill(tokens, 0, original.table, original.slot, memory.kv, memory.states)

    copy = Lane([PageId(p) for p in (0, 11, 3)], SlotId(1))
    used = pages_for_tokens(len(tokens))
    memory.states.import_slot(copy.slot, memory.states.export_slot(original.slot))
    memory.kv.import_pages(copy.table[:used], memory.kv.export_pages(original.table[:used]))

    for step, token in enumerate(prompt_tokens(20, seed=10)):
        position = len(tokens) + step
        from_original = dense_model.decode(
            [token], [position], [original.table], [original.slot], memory.kv, memory.states
        )
        from_copy = dense_model.decode(
            [token], [position], [copy.table], [copy.slot], memory.kv, memory.states
        )
        assert torch.equal(from_original, from_copy), f"step {step}: the restored lane diverged"


def test_flat_buffer_export_matches_bytes_export(dense_model):
    memory = fresh_memory(dense_model)
    lane = memory.lanes(1, 1)[0]
    dense_model.prefill(prompt_tokens(30), 0, lane.table, lane.slot, memory.kv, memory.states)
    host = torch.zeros(memory.states.image_bytes + 16, dtype=torch.uint8)
    memory.states.export_slot_into(lane.slot, host[16:])
    assert host[16:].numpy().tobytes() == memory.states.export_slot(lane.slot)
    bundle = torch.zeros(memory.kv.page_bytes, dtype=torch.uint8)
    memory.kv.export_page_into(lane.table[0], bundle)
    assert bundle.numpy().tobytes() == memory.kv.export_pages([lane.table[0]])


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(1, 150), min_size=4, max_size=4))
def test_batched_decode_equals_each_lane_alone(dense_model, lengths: list[int]):
    memory = fresh_memory(dense_model, num_pages=24, num_slots=6)
    lanes = memory.lanes(4, 3)
    alone_memory = fresh_memory(dense_model, num_pages=24, num_slots=6)
    prompts = [prompt_tokens(length, seed=lane_index) for lane_index, length in enumerate(lengths)]
    for lane, prompt in zip(lanes, prompts):
        dense_model.prefill(prompt, 0, lane.table, lane.slot, memory.kv, memory.states)
        dense_model.prefill(prompt, 0, lane.table, lane.slot, alone_memory.kv, alone_memory.states)
    for step in range(3):
        tokens = [(7 * step + i) % 100 for i in range(4)]
        positions = [length + step for length in lengths]
        batched = dense_model.decode(
            tokens,
            positions,
            [lane.table for lane in lanes],
            [lane.slot for lane in lanes],
            memory.kv,
            memory.states,
        )
        for i, lane in enumerate(lanes):
            alone = dense_model.decode(
                [tokens[i]], [positions[i]], [lane.table], [lane.slot], alone_memory.kv, alone_memory.states
            )[0]
            # batching changes only the reduction order (measured up to 1.1e-5 relative): the same
            # tolerance as the chunk-decomposition baseline, and the same greedy token
            error = float((batched[i] - alone).abs().max()) / float(alone.abs().max())
            assert error <= CHUNK_DECOMPOSITION_RTOL, f"lane {i}: {error}"
            assert int(batched[i].argmax()) == int(alone.argmax()), f"lane {i}"
            assert int(batched[i].argmax()) == int(alone.argmax())


def test_decode_rejects_repeated_slots_and_short_tables(dense_model):
    memory = fresh_memory(dense_model)
    a, b = memory.lanes(2, 1)
    for call in (
        lambda: dense_model.decode(
            [1, 2], [0, 0], [a.table, b.table], [a.slot, a.slot], memory.kv, memory.states
        ),
        lambda: dense_model.decode([1], [BLOCK_TOKENS], [a.table], [a.slot], memory.kv, memory.states),
        lambda: dense_model.prefill([1] * 65, 0, a.table, a.slot, memory.kv, memory.states),
    ):
        try:
            call()
        except ValueError:
            continue
        raise AssertionError("an invalid forward was accepted")
