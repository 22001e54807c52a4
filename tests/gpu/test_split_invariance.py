"""Prefill is split-invariant at block boundaries, bit for bit: a prompt computed in passes that start at
any 64-aligned positions gives the same logits, KV and state as one pass, in float32 and bf16, dense and
MoE. A resume point p anywhere (aligned or not) resumes at the block boundary below it, so the logits of
every token after p equal a cold run's exactly. Passes that start inside a block are not invariant (the
delta rule's sub-chunk is then computed in two pieces); the engine never snapshots there."""

from __future__ import annotations

import itertools
from typing import NamedTuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_testkit import fresh_memory, prompt_tokens

from hybridcache.gpu.model import load_model
from hybridcache.gpu.model.row_tiles import ROW_TILE_TOKENS, tiled_linear

PROMPT = 200
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ModelRun(NamedTuple):
    model: object
    tokens: list[int]
    cold: torch.Tensor  # logits of every position, one pass


@pytest.fixture(scope="module", params=["dense-float32", "dense-bfloat16", "moe-float32", "moe-bfloat16"])
def run(request, dense_checkpoint, moe_checkpoint) -> ModelRun:
    kind, dtype = request.param.split("-")
    model = load_model(dense_checkpoint if kind == "dense" else moe_checkpoint, DTYPES[dtype])
    tokens = prompt_tokens(PROMPT, seed=11)
    return ModelRun(model, tokens, run_passes(model, tokens, []))


def run_passes(model, tokens: list[int], cuts: list[int]) -> torch.Tensor:
    """Prefill `tokens` in passes that end at each of `cuts` (then at the end); logits of every position."""
    memory = fresh_memory(model, num_pages=8, num_slots=1)
    table = list(range(8))
    bounds = [0, *cuts, len(tokens)]
    pieces = [
        model.prefill(tokens[a:b], a, table, 0, memory.kv, memory.states, all_logits=True)
        for a, b in itertools.pairwise(bounds)
    ]
    return torch.cat(pieces)


@settings(
    max_examples=5,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    resume_at=st.integers(min_value=1, max_value=PROMPT - 1),
    earlier_cuts=st.lists(st.integers(min_value=1, max_value=2), max_size=2),
)
def test_logits_after_any_resume_point_equal_a_cold_runs_bitwise(run: ModelRun, resume_at: int, earlier_cuts):
    boundary = resume_at // 64 * 64
    cuts = sorted({64 * k for k in earlier_cuts if 64 * k < boundary} | ({boundary} - {0}))
    resumed = run_passes(run.model, run.tokens, cuts)
    assert torch.equal(resumed[resume_at:], run.cold[resume_at:]), (resume_at, cuts)


def test_a_tiled_product_row_does_not_depend_on_its_neighbours():
    torch.manual_seed(0)
    for dtype in DTYPES.values():
        weight = torch.randn(96, 48).to(dtype)
        rows = torch.randn(3 * ROW_TILE_TOKENS + 5, 48).to(dtype)
        whole = tiled_linear(rows, weight)
        for start, count in ((0, 1), (7, 3), (ROW_TILE_TOKENS - 2, 9), (1, 2 * ROW_TILE_TOKENS)):
            part = tiled_linear(rows[start : start + count], weight)
            assert torch.equal(part, whole[start : start + count]), (dtype, start, count)

