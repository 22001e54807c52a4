"""Hedge snapshots without a split (issue 19): a prefill pass that captures the state at a 64-token
sub-chunk boundary inside it leaves exactly the state (conv and recurrent, every Gated DeltaNet layer)
that a pass split there leaves, bit for bit, in float32 and bf16, dense and MoE, from a fresh start and
from a resumed 64-aligned start; and a resume from the captured state gives the cold run's logits."""

from __future__ import annotations

import itertools

import pytest
import torch
from model_testkit import fresh_memory, prompt_tokens

from hybridcache.gpu.model import load_model
from hybridcache.gpu.model.gated_deltanet import capturing_states

PROMPT = 300
PAGES = 8
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@pytest.fixture(scope="module", params=["dense-float32", "dense-bfloat16", "moe-bfloat16"])
def model(request, dense_checkpoint, moe_checkpoint):
    kind, dtype = request.param.split("-")
    return load_model(dense_checkpoint if kind == "dense" else moe_checkpoint, DTYPES[dtype])


def slot_planes(states, slot: int) -> list[torch.Tensor]:
    return [plane[slot].clone() for plane in states.planes()]


def assert_same_state(left: list[torch.Tensor], right: list[torch.Tensor]) -> None:
    assert len(left) == len(right)
    for index, (a, b) in enumerate(zip(left, right)):
        assert torch.equal(a, b), (index, (a.float() - b.float()).abs().max().item())


@pytest.mark.parametrize("start", [0, 64])
def test_a_captured_state_equals_the_state_a_split_there_leaves(model, start):
    tokens = prompt_tokens(PROMPT, seed=5)
    table = list(range(PAGES))
    # split: passes [0, start), [start, p) for each capture point p
    points = [start + 64, start + 192]
    split = {}
    for point in points:
        memory = fresh_memory(model, num_pages=PAGES, num_slots=1)
        bounds = sorted({0, start, point})
        for a, b in itertools.pairwise(bounds):
            model.prefill(tokens[a:b], a, table, 0, memory.kv, memory.states)
        split[point] = slot_planes(memory.states, 0)
    # one pass from `start` to the end, capturing at both points
    memory = fresh_memory(model, num_pages=PAGES, num_slots=3)
    if start:
        model.prefill(tokens[:start], 0, table, 0, memory.kv, memory.states)
    with capturing_states(memory.states, 0, {p - start: slot for slot, p in enumerate(points, 1)}):
        model.prefill(tokens[start:], start, table, 0, memory.kv, memory.states)
    for slot, point in enumerate(points, 1):
        assert_same_state(slot_planes(memory.states, slot), split[point])


def test_a_resume_from_a_captured_state_gives_the_cold_logits_bitwise(model):
    tokens = prompt_tokens(PROMPT, seed=9)
    table = list(range(PAGES))
    memory = fresh_memory(model, num_pages=PAGES, num_slots=2)
    with capturing_states(memory.states, 0, {128: 1}):
        cold = model.prefill(tokens, 0, table, 0, memory.kv, memory.states, all_logits=True)
    resumed = model.prefill(tokens[128:], 128, table, 1, memory.kv, memory.states, all_logits=True)
    assert torch.equal(resumed, cold[128:])


def test_capture_offsets_must_be_positive(model):
    memory = fresh_memory(model, num_pages=PAGES, num_slots=2)
    for offsets in ({0: 1}, {-64: 1}):
        with pytest.raises(ValueError), capturing_states(memory.states, 0, offsets):
            pass
