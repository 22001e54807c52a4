"""Exact endpoints: a chat-like follow-up (the previous prompt, its generated tokens, new user text) that
resumes inside the previous answer after the idle-time re-prefill gives the cold run's numbers bit for
bit, from the re-prefill's snapshot at the answer's end (where the decode ended); before the re-prefill an
exact resume stops at the last prefill-produced snapshot."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.integrity import check_integrity
from hybridcache.core.endpoint_refills import REFILL_CHUNK_TOKENS
from hybridcache.core.frontend import Frontend
from hybridcache.core.sampling_params import SamplingParams
from tests.core.engine_kit import Generated, cold_run, filler_tokens, generate, start_engine

DTYPES = ("float32", "bfloat16")
STEPS = 32
SAMPLING = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
ANSWER = 150  # tokens of the first turn's answer: two whole blocks and a partial one past the prompt


@pytest.fixture(scope="module")
def frontend(micro_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(micro_checkpoint, 32768)


@pytest.fixture(scope="module")
def moe_with_tokenizer(tmp_path_factory: pytest.TempPathFactory, micro_checkpoint: Path) -> Path:
    """A tiny Qwen3.5-MoE (transformers-saved) served with the micro checkpoint's byte tokenizer."""
    from tests.gpu.model_testkit import build_reference_checkpoint

    directory = build_reference_checkpoint(tmp_path_factory.mktemp("moe") / "ckpt", moe=True, seed=1)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(micro_checkpoint / name, directory / name)
    return directory


@pytest.fixture(params=["dense", "moe"])
def model_dir(request, micro_checkpoint: Path) -> Path:
    return micro_checkpoint if request.param == "dense" else request.getfixturevalue("moe_with_tokenizer")


async def chat_turns(
    model_dir: Path, frontend: Frontend, dtype: str, **options
) -> tuple[Generated, list[int], dict[str, object]]:
    """Turn 1 answers ANSWER tokens; the engine settles (idle work runs); turn 2 extends it."""
    first = filler_tokens(300, seed=50)
    engine = await start_engine(model_dir, dtype=dtype, host_cache_mib=64, **options)
    try:
        answer = await generate(engine, frontend.prepare_tokens(first), ANSWER)
        assert await engine.settle()
        check_integrity(engine.cache.index)
        follow_up = first + answer.tokens + filler_tokens(90, seed=51)
        resumed = await generate(engine, frontend.prepare_tokens(follow_up), STEPS)
        stats = engine.stats()
    finally:
        await engine.stop()
    return resumed, follow_up, stats


@pytest.mark.parametrize("dtype", DTYPES)
async def test_a_follow_up_resumes_inside_the_answer_exactly_after_the_idle_refill(
    model_dir: Path, dtype: str
):
    frontend = Frontend.from_dir(model_dir, 32768)  # the MoE model's vocabulary is larger than micro's
    resumed, follow_up, stats = await chat_turns(model_dir, frontend, dtype)
    computed = 300 + ANSWER - 1  # the last sampled token has no KV yet
    assert stats["endpoint_refills_finished"] == 1
    assert stats["blocks_made_exact"] == computed // BLOCK_TOKENS - 300 // BLOCK_TOKENS
    assert resumed.accounting.reuse_tokens == computed  # the refill's tail tap at n - 1 of prompt + answer
    cold = await cold_run(model_dir, frontend, follow_up, dtype, STEPS)
    assert resumed.first_logprobs == cold.first_logprobs  # bit for bit, every top-20 entry
    assert resumed.tokens == cold.tokens


@pytest.mark.parametrize("dtype", DTYPES)
async def test_without_the_refill_an_exact_resume_stops_before_the_answer(
    micro_checkpoint: Path, frontend: Frontend, dtype: str
):
    resumed, follow_up, stats = await chat_turns(micro_checkpoint, frontend, dtype, endpoint_refill=False)
    assert stats["endpoint_refills_finished"] == 0
    assert resumed.accounting.reuse_tokens == 299  # the first prompt's tail at n - 1
    cold = await cold_run(micro_checkpoint, frontend, follow_up, dtype, STEPS)
    assert resumed.first_logprobs == cold.first_logprobs
    assert resumed.tokens == cold.tokens


async def test_an_inexact_resume_starts_from_the_decode_endpoint(micro_checkpoint: Path, frontend: Frontend):
    resumed, _, _ = await chat_turns(
        micro_checkpoint, frontend, "float32", endpoint_refill=False, exact_resume=False
    )
    assert resumed.accounting.reuse_tokens == 300 + ANSWER - 1


async def test_a_request_arriving_mid_refill_waits_one_chunk_and_the_refill_continues_later(
    micro_checkpoint: Path, frontend: Frontend
):
    first = filler_tokens(300, seed=52)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    try:
        answer = await generate(engine, frontend.prepare_tokens(first), 600)
        # The worker started the refill of [299, 900) as soon as it went idle (from the prompt's tail at
        # n - 1): its first pass, cut at the block boundary 384, is running.
        unrelated = frontend.prepare_tokens(filler_tokens(200, seed=53), prefix_reuse=False)  # no refill
        other = engine.submit(unrelated, SAMPLING)
        notice = await anext(other)
        at_admission = engine.stats()
        async for _ in other:
            pass
        assert await engine.settle()
        follow_up = first + answer.tokens + filler_tokens(90, seed=54)
        resumed = await generate(engine, frontend.prepare_tokens(follow_up), STEPS)
        stats = engine.stats()
        check_integrity(engine.cache.index)
    finally:
        await engine.stop()
    assert notice.accounting is not None
    assert at_admission["endpoint_refills_preempted"] == 1
    first_pass = (299 + REFILL_CHUNK_TOKENS) // BLOCK_TOKENS * BLOCK_TOKENS - 299  # one pass ran before it
    assert at_admission["endpoint_refill_tokens"] == first_pass
    assert stats["endpoint_refills_finished"] == 1
    # the second attempt resumed where the first stopped (the cancel published the state at 384)
    assert stats["endpoint_refill_tokens"] == (300 + 600) - 299
    assert resumed.accounting.reuse_tokens == 300 + 600 - 1  # where the decode ended
    cold = await cold_run(micro_checkpoint, frontend, follow_up, "auto", STEPS)
    assert resumed.first_logprobs == cold.first_logprobs
    assert resumed.tokens == cold.tokens


def test_a_refill_whose_exact_start_was_evicted_is_dropped():
    from hybridcache.core.endpoint_refills import RefillJob

    job = RefillJob(tuple(range(1000)), exact_tokens=800)  # the prompt's tail tap sat at 768
    assert job.worth_running(768) and job.worth_running(640)  # a chunk earlier is still fine
    assert not job.worth_running(576) and not job.worth_running(0)


def test_a_newer_turn_replaces_the_waiting_refill_of_the_turn_it_extends():
    from hybridcache.core.endpoint_refills import EndpointRefills, RefillJob

    refills = EndpointRefills()
    refills.add(RefillJob(tuple(range(300)), 200))
    refills.add(RefillJob(tuple(range(500)), 400))  # the next turn of the same conversation
    refills.add(RefillJob(tuple(range(500)), 400, extra_key=7))  # the same tokens under another salt
    assert [(len(job.token_ids), job.extra_key) for job in refills.pending] == [(500, 0), (500, 7)]
