"""The decode fast paths: recurrent states updated in place through runs of consecutive slots, and matmul
weights packed for oneDNN at load time. Each must compute what the plain path computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_testkit import Lane, build_reference_checkpoint, fresh_memory, prompt_tokens

from hybridcache.cache.ids import PageId, SlotId
from hybridcache.gpu.model import load_model
from hybridcache.gpu.model import loader as loader_module
from hybridcache.gpu.model.checkpoint import CheckpointWeights
from hybridcache.gpu.model.delta_rule import recurrent_gated_delta_rule_
from hybridcache.gpu.model.onednn_packing import can_pack
from hybridcache.gpu.model.tolerance import CHUNK_DECOMPOSITION_RTOL
from hybridcache.gpu.state_slots import plan_slot_runs

needs_packing = pytest.mark.skipif(
    not can_pack(torch.bfloat16, "cpu"), reason="this torch build cannot pack bf16 weights for oneDNN"
)


# -- slot runs ------------------------------------------------------------------------------------------


def assert_runs_cover_the_lanes_in_slot_order(slots: list[int]) -> None:
    plan = plan_slot_runs([SlotId(s) for s in slots])
    assert plan.index.tolist() == slots
    order = list(range(len(slots))) if plan.order is None else plan.order.tolist()
    assert [slots[lane] for lane in order] == sorted(slots)
    covered = 0
    for run in plan.runs:
        assert run.lanes.start == covered, "runs must tile the sorted lanes in order"
        run_slots = [slots[lane] for lane in order[run.lanes]]
        assert run_slots == list(range(run.first_slot, run.first_slot + len(run_slots)))
        covered = run.lanes.stop
    assert covered == len(slots)
    gaps = sum(1 for a, b in zip(sorted(slots), sorted(slots)[1:]) if b != a + 1)
    assert len(plan.runs) == gaps + 1, "a run ends only where the sorted slots jump"


@settings(max_examples=60, deadline=None)
@given(slots=st.lists(st.integers(0, 40), min_size=1, max_size=9, unique=True))
def test_slot_runs_tile_the_batch_in_slot_order(slots: list[int]):
    assert_runs_cover_the_lanes_in_slot_order(slots)


def test_slot_runs_of_an_ascending_batch_need_no_permutation():
    plan = plan_slot_runs([SlotId(3), SlotId(4), SlotId(5), SlotId(9)])
    assert plan.order is None
    assert [(run.first_slot, run.lanes) for run in plan.runs] == [(3, slice(0, 3)), (9, slice(3, 4))]


def test_slot_runs_reject_a_repeated_slot():
    with pytest.raises(ValueError, match="distinct"):
        plan_slot_runs([SlotId(1), SlotId(2), SlotId(1)])


# -- the in-place recurrent step ------------------------------------------------------------------------


def reference_recurrent_step(q, k, v, log_decay, beta, state):
    """The textbook form: decay, predict, correct, read the new state (fp32, on copies)."""
    group = v.shape[-2] // k.shape[-2]
    q = torch.nn.functional.normalize(q.float(), dim=-1, eps=1e-6).repeat_interleave(group, -2)
    k = torch.nn.functional.normalize(k.float(), dim=-1, eps=1e-6).repeat_interleave(group, -2)
    q = q * q.shape[-1] ** -0.5
    decayed = state * log_decay.exp()[..., None, None]
    delta = (v - (k.unsqueeze(-2) @ decayed).squeeze(-2)) * beta.unsqueeze(-1)
    new_state = decayed + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return (q.unsqueeze(-2) @ new_state).squeeze(-2), new_state


@settings(max_examples=25, deadline=None)
@given(slots=st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True), seed=st.integers(0, 2**16))
def test_in_place_recurrent_step_matches_the_textbook_rule(slots: list[int], seed: int):
    generator = torch.Generator().manual_seed(seed)
    lanes, key_heads, value_heads, dk, dv = len(slots), 2, 4, 8, 6

    def rand(*shape):
        return torch.randn(*shape, generator=generator)

    q, k, v = rand(lanes, key_heads, dk), rand(lanes, key_heads, dk), rand(lanes, value_heads, dv)
    log_decay, beta = -rand(lanes, value_heads).abs(), torch.rand(lanes, value_heads, generator=generator)
    plane = rand(10, value_heads, dk, dv)
    before = plane.clone()
    expected_out, expected_states = reference_recurrent_step(q, k, v, log_decay, beta, before[slots])

    out = recurrent_gated_delta_rule_(q, k, v, log_decay, beta, plane, plan_slot_runs(slots))

    torch.testing.assert_close(out, expected_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(plane[slots], expected_states, rtol=1e-5, atol=1e-5)
    untouched = [s for s in range(10) if s not in slots]
    assert torch.equal(plane[untouched], before[untouched]), "a slot outside the batch changed"


# -- batched decode in any slot order ------------------------------------------------------------------


def lanes_with_slots(slots: list[int], pages_each: int) -> list[Lane]:
    count = len(slots)
    return [
        Lane([PageId(lane + count * i) for i in range(pages_each)], SlotId(slot))
        for lane, slot in enumerate(slots)
    ]


def assert_lane_matches_alone(batched: torch.Tensor, alone: torch.Tensor, what: str) -> None:
    error = float((batched - alone).abs().max()) / float(alone.abs().max())
    assert error <= CHUNK_DECOMPOSITION_RTOL, f"{what}: relative error {error}"
    assert int(batched.argmax()) == int(alone.argmax()), f"{what}: greedy token differs"


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    slots=st.lists(st.integers(0, 7), min_size=3, max_size=3, unique=True),
    lengths=st.one_of(
        st.lists(st.integers(1, 140), min_size=3, max_size=3),
        st.integers(1, 140).map(lambda n: [n, n, n]),  # equal lengths: the unmasked attention path
    ),
)
def test_batched_decode_in_any_slot_order_equals_each_lane_alone(dense_model, slots, lengths):
    memory = fresh_memory(dense_model, num_pages=12, num_slots=8)
    alone_memory = fresh_memory(dense_model, num_pages=12, num_slots=8)
    lanes = lanes_with_slots(slots, 4)
    for index, (lane, length) in enumerate(zip(lanes, lengths)):
        prompt = prompt_tokens(length, seed=index)
        for target in (memory, alone_memory):
            dense_model.prefill(prompt, 0, lane.table, lane.slot, target.kv, target.states)
    for step in range(3):
        tokens = [(5 * step + 11 * i) % 100 for i in range(len(lanes))]
        positions = [length + step for length in lengths]
        batched = dense_model.decode(
            tokens, positions, [lane.table for lane in lanes], [lane.slot for lane in lanes], *memory
        )
        for i, lane in enumerate(lanes):
            alone = dense_model.decode([tokens[i]], [positions[i]], [lane.table], [lane.slot], *alone_memory)
            assert_lane_matches_alone(batched[i], alone[0], f"step {step} lane {i} (slot {lane.slot})")


# -- packed weights ------------------------------------------------------------------------------------


def run_prefill_then_batched_decode(model, steps: int = 3) -> list[torch.Tensor]:
    """Logits of a 2-lane story (prefills of 40 and 70 tokens, then `steps` batched decode rounds)."""
    memory = fresh_memory(model, num_pages=12, num_slots=4)
    lanes = lanes_with_slots([2, 1], 4)
    outputs = []
    for lane, length in zip(lanes, (40, 70)):
        prompt = prompt_tokens(length)
        outputs.append(model.prefill(prompt, 0, lane.table, lane.slot, *memory, all_logits=True))
    for step in range(steps):
        outputs.append(
            model.decode([3 + step, 9], [40 + step, 70 + step], [la.table for la in lanes], [2, 1], *memory)
        )
    return outputs


def assert_packed(model) -> None:
    assert model.layers[0].mixer.in_proj.is_mkldnn, "a Gated DeltaNet projection is not packed"
    assert model.layers[3].mixer.qkv_proj.is_mkldnn, "an attention projection is not packed"
    assert all(block.is_mkldnn for block in model.lm_head), "the lm_head is not packed"
    assert not model.embed_tokens.is_mkldnn, "embedding lookups need the plain table"


@needs_packing
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_packed_bf16_weights_compute_exactly_what_plain_ones_do(kind, dense_checkpoint, moe_checkpoint):
    checkpoint = dense_checkpoint if kind == "dense" else moe_checkpoint
    packed = load_model(checkpoint, dtype=torch.bfloat16)  # packing is the CPU bf16 default
    plain = load_model(checkpoint, dtype=torch.bfloat16, pack_weights=False)
    assert_packed(packed)
    assert not any(block.is_mkldnn for block in plain.lm_head)
    for got, expected in zip(run_prefill_then_batched_decode(packed), run_prefill_then_batched_decode(plain)):
        assert torch.equal(got, expected), "packed and plain matmuls disagree"


@needs_packing
def test_a_tied_lm_head_packs_in_row_blocks_and_keeps_the_embedding(tmp_path: Path, monkeypatch):
    checkpoint = build_reference_checkpoint(tmp_path / "tied", tied=True, seed=2)
    monkeypatch.setattr(loader_module, "ROW_BLOCK", 192)  # 512 vocabulary rows: blocks of 192, 192, 128
    packed = load_model(checkpoint, dtype=torch.bfloat16)
    plain = load_model(checkpoint, dtype=torch.bfloat16, pack_weights=False)
    assert len(packed.lm_head) == 3 and len(plain.lm_head) == 1
    assert plain.lm_head[0].data_ptr() == plain.embed_tokens.data_ptr(), "tied: one table, not a copy"
    for got, expected in zip(run_prefill_then_batched_decode(packed), run_prefill_then_batched_decode(plain)):
        assert torch.equal(got, expected)


def test_released_weight_pages_read_back_the_same_bytes(dense_checkpoint: Path):
    """Dropping resident pages of a weight (after packing a copy) leaves its views valid: the mapping is
    copy-on-write and unwritten, so the bytes fault back in from the file."""
    weights = CheckpointWeights(dense_checkpoint)
    name = "model.embed_tokens.weight"  # 512 x 64 fp32: 128 KiB, many whole pages
    view = weights.tensor(name)
    before = view.clone()
    weights.release(name, slice(100, 400))
    assert torch.equal(view, before)
    weights.release(name)
    assert torch.equal(view, before)
