"""Snapshots inside a block resume bit-exactly (issue 20, option (a)): a cold pass that captures the state at
any position p (aligned or not) leaves the state at the block boundary below p plus the layer inputs since
(a pending tail), and a prefill resumed from it, in any later passes that end on block boundaries, gives
every logit after p exactly as the cold run does, on the full vocabulary, in float32 and bf16, dense and MoE.
The attention tile of p is run with placeholder queries for [floor64(p), p), which must not change the rows
from p on."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_testkit import fresh_memory, prompt_tokens

from hybridcache.gpu.model import load_model
from hybridcache.gpu.model.gated_deltanet import capturing_states
from hybridcache.gpu.model.row_tiles import causal_attention_in_tiles

PROMPT = 200
PAGES = 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ModelRun(NamedTuple):
    model: object
    tokens: list[int]
    cold: torch.Tensor  # logits of every position, one pass


@pytest.fixture(scope="module", params=["dense-float32", "dense-bfloat16", "moe-float32", "moe-bfloat16"])
def run(request, dense_checkpoint, moe_checkpoint) -> ModelRun:
    kind, dtype = request.param.split("-")
    model = load_model(dense_checkpoint if kind == "dense" else moe_checkpoint, DTYPES[dtype])
    tokens = prompt_tokens(PROMPT, seed=13)
    memory = fresh_memory(model, num_pages=PAGES, num_slots=1)
    cold = model.prefill(tokens, 0, list(range(PAGES)), 0, memory.kv, memory.states, all_logits=True)
    return ModelRun(model, tokens, cold)


def resume_from_capture(
    run: ModelRun, capture_at: int, pass_start: int, cuts: list[int], pass_end: int = PROMPT
) -> torch.Tensor:
    """Prefill [0, pass_start) plainly, then one pass to `pass_end` that captures the state at
    `capture_at` into slot 1; resume slot 1 from `capture_at` in passes ending at `cuts`; logits after
    `capture_at`."""
    model, tokens = run.model, run.tokens
    memory = fresh_memory(model, num_pages=PAGES, num_slots=2)
    table = list(range(PAGES))
    if pass_start:
        model.prefill(tokens[:pass_start], 0, table, 0, memory.kv, memory.states)
    with capturing_states(memory.states, 0, {capture_at - pass_start: 1}):
        model.prefill(tokens[pass_start:pass_end], pass_start, table, 0, memory.kv, memory.states)
    assert memory.states.tail_tokens(1) == capture_at % 64
    bounds = [capture_at, *cuts, len(tokens)]
    pieces = [
        model.prefill(tokens[a:b], a, table, 1, memory.kv, memory.states, all_logits=True)
        for a, b in itertools.pairwise(bounds)
    ]
    assert memory.states.tail_tokens(1) == 0
    return torch.cat(pieces)


@settings(max_examples=4, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(
    capture_at=st.integers(min_value=1, max_value=PROMPT - 1),
    pass_start_blocks=st.integers(min_value=0, max_value=3),
    cut_blocks=st.lists(st.integers(min_value=1, max_value=4), max_size=2),
    ends_the_prompt=st.booleans(),
)
def test_logits_after_a_snapshot_inside_a_block_equal_the_cold_runs_bitwise(
    run: ModelRun, capture_at: int, pass_start_blocks: int, cut_blocks: list[int], ends_the_prompt: bool
):
    """The capturing pass ends at the prompt end or one token after the capture (a shorter earlier prompt
    whose tail n - 1 is captured: the rows near a pass's end must come out as in a longer pass)."""
    pass_start = min(64 * pass_start_blocks, capture_at - capture_at % 64)
    pass_start = pass_start if pass_start < capture_at else max(0, pass_start - 64)
    cuts = sorted({64 * k for k in cut_blocks if capture_at < 64 * k < PROMPT})
    pass_end = PROMPT if ends_the_prompt else capture_at + 1
    resumed = resume_from_capture(run, capture_at, pass_start, cuts, pass_end)
    assert torch.equal(resumed, run.cold[capture_at:]), (capture_at, pass_start, cuts, pass_end)


def test_a_prompt_tail_captured_one_token_before_its_pass_end_resumes_exactly(run: ModelRun):
    for capture_at in (PROMPT - 1, 64 * 2 + 1, 64 * 2, 64 * 2 + 51):
        resumed = resume_from_capture(run, capture_at, 0, [], capture_at + 1)
        assert torch.equal(resumed, run.cold[capture_at:]), capture_at


def test_a_pending_tail_travels_with_the_slot_image(run: ModelRun):
    """Export/import (host copies, the cache file) carry the tail: a resume from the imported image is
    exact."""
    model, tokens = run.model, run.tokens
    memory = fresh_memory(model, num_pages=PAGES, num_slots=3)
    table = list(range(PAGES))
    with capturing_states(memory.states, 0, {150: 1}):
        model.prefill(tokens, 0, table, 0, memory.kv, memory.states)
    memory.states.import_slot(2, memory.states.export_slot(1))
    resumed = model.prefill(tokens[150:], 150, table, 2, memory.kv, memory.states, all_logits=True)
    assert torch.equal(resumed, run.cold[150:])


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
def test_placeholder_queries_before_the_pass_start_leave_the_later_rows_unchanged(dtype):
    torch.manual_seed(3)
    end, heads, kv_heads, dim = 200, 4, 2, 32
    query = torch.randn(end, heads, dim).to(dtype)
    keys = torch.randn(end, kv_heads, dim).to(dtype)
    values = torch.randn(end, kv_heads, dim).to(dtype)
    whole = causal_attention_in_tiles(query, keys, values, dim**-0.5)
    for start in (1, 63, 65, 100, 127, 199):
        part = causal_attention_in_tiles(query[start:], keys, values, dim**-0.5)
        assert torch.equal(part, whole[start:]), start
