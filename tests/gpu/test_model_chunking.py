"""The chunk-decomposition baseline: one prompt prefilled in chunks of 64, 256 and 2048 tokens gives the same
logits (within `CHUNK_DECOMPOSITION_RTOL`) and the same 64 greedy tokens. Resume exactness is measured
against this baseline later, so the measured error is printed.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_testkit import fresh_memory, greedy_continue, prefill_in_chunks, prompt_tokens

from hybridcache.gpu.model.tolerance import CHUNK_DECOMPOSITION_RTOL, assert_logits_close, relative_error

PROMPT_LENGTH = 700
GREEDY_STEPS = 64
CHUNK_SIZES = (64, 256, 2048)


def run_with_chunk(model, tokens: list[int], chunk: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    memory = fresh_memory(model, num_pages=16, num_slots=2)
    lane = memory.lanes(1, 13)[0]
    prefill = prefill_in_chunks(model, tokens, chunk, lane, memory)
    greedy, decode_logits = greedy_continue(model, prefill[-1], len(tokens), GREEDY_STEPS, lane, memory)
    return prefill, greedy, decode_logits


def test_chunk_sizes_agree_on_logits_and_greedy_tokens(dense_model):
    tokens = prompt_tokens(PROMPT_LENGTH, seed=3)
    baseline_prefill, baseline_greedy, baseline_decode = run_with_chunk(dense_model, tokens, CHUNK_SIZES[-1])
    assert len(set(baseline_greedy)) > 1, "degenerate checkpoint: greedy decoding repeats one token"
    for chunk in CHUNK_SIZES[:-1]:
        prefill, greedy, decode = run_with_chunk(dense_model, tokens, chunk)
        prefill_error = assert_logits_close(
            prefill, baseline_prefill, CHUNK_DECOMPOSITION_RTOL, f"chunk {chunk}"
        )
        decode_error = relative_error(decode, baseline_decode)
        print(f"chunk={chunk} prefill_rel_error={prefill_error:.3g} decode_rel_error={decode_error:.3g}")
        assert greedy == baseline_greedy, f"chunk {chunk}: greedy tokens diverge"
        assert_logits_close(decode, baseline_decode, CHUNK_DECOMPOSITION_RTOL, f"chunk {chunk} decode")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(split=st.integers(min_value=1, max_value=199))
def test_any_split_point_continues_like_one_pass(dense_model, split: int):
    """A chunk may start anywhere, page-aligned or not: attention reads earlier pages through the table."""
    tokens = prompt_tokens(200, seed=5)
    memory = fresh_memory(dense_model, num_pages=8, num_slots=2)
    whole_lane, split_lane = memory.lanes(2, 4)
    whole = dense_model.prefill(
        tokens, 0, whole_lane.table, whole_lane.slot, memory.kv, memory.states, all_logits=True
    )
    dense_model.prefill(tokens[:split], 0, split_lane.table, split_lane.slot, memory.kv, memory.states)
    rest = dense_model.prefill(
        tokens[split:], split, split_lane.table, split_lane.slot, memory.kv, memory.states, all_logits=True
    )
    assert_logits_close(rest, whole[split:], CHUNK_DECOMPOSITION_RTOL, f"split at {split}")
