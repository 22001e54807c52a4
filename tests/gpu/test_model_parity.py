"""Our forward on paged KV and state slots computes what transformers' Qwen3.5 computes (fp32, 1e-4 rel).

Stories: a single 300-token pass; the same prompt as [0:128) + [128:300) through pages and a slot; then 50
decode steps fed the same tokens on both sides. Dense and MoE checkpoints alike.
"""

from __future__ import annotations

import pytest
import torch
from model_testkit import fresh_memory, prefill_in_chunks, prompt_tokens

from hybridcache.gpu.model.tolerance import REFERENCE_RTOL, assert_logits_close

PROMPT_LENGTH = 300
DECODE_STEPS = 50


@pytest.fixture(params=["dense", "moe"])
def pair(request: pytest.FixtureRequest):
    """(our model, transformers' model) on the same checkpoint."""
    kind = request.param
    return request.getfixturevalue(f"{kind}_model"), request.getfixturevalue(f"{kind}_reference")


def reference_logits(reference: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return reference(torch.tensor([tokens])).logits[0]


def test_single_pass_matches_transformers(pair):
    model, reference = pair
    tokens = prompt_tokens(PROMPT_LENGTH)
    memory = fresh_memory(model)
    lane = memory.lanes(1, 5)[0]

    ours = prefill_in_chunks(model, tokens, PROMPT_LENGTH, lane, memory)

    expected = reference_logits(reference, tokens)
    assert expected.abs().max() > 1.0, "degenerate checkpoint: logits barely vary"
    assert_logits_close(ours, expected, REFERENCE_RTOL, "single pass")


def test_last_position_logits_are_the_default_return(pair):
    model, _ = pair
    tokens = prompt_tokens(70)
    memory = fresh_memory(model)
    lane = memory.lanes(1, 2)[0]
    last = model.prefill(tokens, 0, lane.table, lane.slot, memory.kv, memory.states)
    all_positions = model.prefill(tokens, 0, lane.table, lane.slot, memory.kv, memory.states, all_logits=True)
    assert last.shape == (model.config.vocab_size,)
    assert_logits_close(last, all_positions[-1], 1e-6, "last position alone vs among all")  # GEMM shape only


def test_chunked_prefill_then_decode_matches_transformers(pair):
    model, reference = pair
    tokens = prompt_tokens(PROMPT_LENGTH)
    continuation = prompt_tokens(DECODE_STEPS, seed=11)
    memory = fresh_memory(model)
    lane = memory.lanes(3, 6)[1]  # a middle lane: pages interleaved with other lanes', slot not 0

    first = model.prefill(tokens[:128], 0, lane.table, lane.slot, memory.kv, memory.states, all_logits=True)
    second = model.prefill(
        tokens[128:], 128, lane.table, lane.slot, memory.kv, memory.states, all_logits=True
    )
    assert_logits_close(
        torch.cat([first, second]),
        reference_logits(reference, tokens),
        REFERENCE_RTOL,
        "chunked prefill [0:128)+[128:300)",
    )

    with torch.inference_mode():
        out = reference(torch.tensor([tokens]), use_cache=True)
        cache = out.cache
        for step, token in enumerate(continuation):
            expected = reference(torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1]
            ours = model.decode(
                [token], [PROMPT_LENGTH + step], [lane.table], [lane.slot], memory.kv, memory.states
            )[0]
            assert_logits_close(ours, expected, REFERENCE_RTOL, f"decode step {step}")


def test_layer_hook_sees_every_layer_in_order_before_it_runs(dense_model):
    memory = fresh_memory(dense_model)
    lane = memory.lanes(1, 2)[0]
    seen: list[int] = []
    dense_model.prefill(
        prompt_tokens(10), 0, lane.table, lane.slot, memory.kv, memory.states, layer_hook=seen.append
    )
    dense_model.decode([1], [10], [lane.table], [lane.slot], memory.kv, memory.states, layer_hook=seen.append)
    layers = list(range(dense_model.config.num_hidden_layers))
    assert seen == layers + layers


def test_layer_hook_runs_before_the_layer_reads_its_memory(dense_model):
    """A hook that restores a layer's state just in time gives the same logits as restoring it up front."""
    memory = fresh_memory(dense_model)
    lane = memory.lanes(1, 2)[0]
    tokens = prompt_tokens(40)
    dense_model.prefill(tokens[:30], 0, lane.table, lane.slot, memory.kv, memory.states)
    image = memory.states.export_slot(lane.slot)
    expected = dense_model.prefill(tokens[30:], 30, lane.table, lane.slot, memory.kv, memory.states)

    memory.states.import_slot(lane.slot, image)
    saved = {
        p.name: memory.states.planes()[i][lane.slot].clone() for i, p in enumerate(memory.states.image_parts)
    }
    memory.states.reset_slot(lane.slot)

    def restore_layer(layer: int) -> None:
        for i, part in enumerate(memory.states.image_parts):
            if part.layer == layer:
                memory.states.planes()[i][lane.slot].copy_(saved[part.name])

    got = dense_model.prefill(
        tokens[30:], 30, lane.table, lane.slot, memory.kv, memory.states, layer_hook=restore_layer
    )
    assert torch.equal(got, expected)
