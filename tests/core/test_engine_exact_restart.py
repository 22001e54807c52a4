"""Exactness marks survive a restart: the prefix-cache file and the cache directory store decode-produced
(inexact) blocks and snapshots with their marks, so a restarted exact-only engine still resumes only from
exact entries (the cold run's numbers bit for bit) and one with --inexact-resume uses the marked ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hybridcache.core.frontend import Frontend
from hybridcache.persistence.cache_file import open_tables
from hybridcache.persistence.contents_check import check_directory
from hybridcache.persistence.file_summary import summarize
from hybridcache.tools.inspect import format_summary
from tests.core.engine_kit import Generated, cold_run, filler_tokens, generate, start_engine

STEPS = 32
PROMPT = 300
ANSWER = 150  # two whole blocks and a partial one past the prompt: decode-produced KV and endpoint


@pytest.fixture(scope="module")
def frontend(micro_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(micro_checkpoint, 32768)


async def first_turn(model_dir: Path, frontend: Frontend, dtype: str, **options) -> list[int]:
    """Runs turn 1 (its answer decoded) on an engine that stops afterwards; returns turn 2's prompt."""
    prompt = filler_tokens(PROMPT, seed=60)
    engine = await start_engine(model_dir, dtype=dtype, host_cache_mib=64, **options)
    try:
        answer = await generate(engine, frontend.prepare_tokens(prompt), ANSWER)
        assert await engine.settle()
    finally:
        await engine.stop()
    return prompt + answer.tokens + filler_tokens(90, seed=61)


async def follow_up_after_restart(
    model_dir: Path, frontend: Frontend, dtype: str, follow_up: list[int], **options
) -> Generated:
    engine = await start_engine(model_dir, dtype=dtype, host_cache_mib=64, **options)
    try:
        engine.check_integrity()
        resumed = await generate(engine, frontend.prepare_tokens(follow_up), STEPS)
        engine.check_integrity()
    finally:
        await engine.stop()
    return resumed


def assert_identical(resumed: Generated, cold: Generated) -> None:
    assert resumed.first_logprobs == cold.first_logprobs  # exact float equality, every top-20 entry
    assert resumed.tokens == cold.tokens


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
async def test_the_cache_file_keeps_the_marks_and_an_exact_restart_skips_the_inexact_entries(
    micro_checkpoint: Path, frontend: Frontend, tmp_path: Path, dtype: str
):
    saved = tmp_path / "prefix.cache"
    # --inexact-resume and no refill: the answer's blocks and its endpoint stay decode-produced
    follow_up = await first_turn(
        micro_checkpoint, frontend, dtype, prefix_cache_file=str(saved), exact_resume=False,
        endpoint_refill=False,
    )
    summary = summarize(str(saved), open_tables(saved))
    assert summary.inexact_blocks == (PROMPT + ANSWER - 1) // 64 - PROMPT // 64  # the answer's whole blocks
    assert summary.inexact_snapshots == 1
    assert [row.frontier for row in summary.snapshots if not row.exact] == [PROMPT + ANSWER - 1]
    assert any(row.exact and row.frontier == PROMPT - 1 for row in summary.snapshots)  # the prompt's tail
    shown = format_summary(summary, summary.snapshots)
    assert f"inexact       {summary.inexact_blocks} blocks, 1 snapshots" in shown
    assert shown.count(" no\n") + shown.endswith(" no") == 1  # the endpoint's row in the exact column
    copy = tmp_path / "copy.cache"
    shutil.copy(saved, copy)

    exact = await follow_up_after_restart(
        micro_checkpoint, frontend, dtype, follow_up, prefix_cache_file=str(saved)
    )
    assert exact.accounting.source == "host" and exact.accounting.reuse_tokens == PROMPT - 1
    assert_identical(exact, await cold_run(micro_checkpoint, frontend, follow_up, dtype, STEPS))

    inexact = await follow_up_after_restart(
        micro_checkpoint, frontend, dtype, follow_up, prefix_cache_file=str(copy), exact_resume=False
    )
    assert inexact.accounting.reuse_tokens == PROMPT + ANSWER - 1  # the restored inexact endpoint


async def test_the_cache_directory_keeps_the_marks_and_an_exact_restart_skips_the_inexact_entries(
    micro_checkpoint: Path, frontend: Frontend, tmp_path: Path
):
    directory = tmp_path / "cache"
    follow_up = await first_turn(
        micro_checkpoint, frontend, "bfloat16", cache_dir=str(directory), exact_resume=False,
        endpoint_refill=False,
    )
    check = check_directory(directory)
    assert check.clean and check.listed_inexact_snapshots == 1
    assert check.listed_inexact_blocks == (PROMPT + ANSWER - 1) // 64 - PROMPT // 64
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)

    exact = await follow_up_after_restart(
        micro_checkpoint, frontend, "bfloat16", follow_up, cache_dir=str(directory)
    )
    assert exact.accounting.source == "host" and exact.accounting.reuse_tokens == PROMPT - 1
    assert_identical(exact, await cold_run(micro_checkpoint, frontend, follow_up, "bfloat16", STEPS))

    inexact = await follow_up_after_restart(
        micro_checkpoint, frontend, "bfloat16", follow_up, cache_dir=str(copy), exact_resume=False
    )
    assert inexact.accounting.reuse_tokens == PROMPT + ANSWER - 1


async def test_blocks_a_refill_made_exact_are_stored_again_as_exact_in_the_cache_directory(
    micro_checkpoint: Path, frontend: Frontend, tmp_path: Path
):
    directory = tmp_path / "cache"
    # exact-only with the idle refill: the answer's blocks are first stored inexact (write-through), then
    # the refill replaces them (their inexact host copies are released) and stores them exact
    follow_up = await first_turn(micro_checkpoint, frontend, "bfloat16", cache_dir=str(directory))
    check = check_directory(directory)
    assert check.clean and check.listed_inexact_blocks == 0 and check.listed_inexact_snapshots == 0

    resumed = await follow_up_after_restart(
        micro_checkpoint, frontend, "bfloat16", follow_up, cache_dir=str(directory)
    )
    assert resumed.accounting.source == "host"
    assert resumed.accounting.reuse_tokens == PROMPT + ANSWER - 1  # the refill's tap at the answer's end
    assert_identical(resumed, await cold_run(micro_checkpoint, frontend, follow_up, "bfloat16", STEPS))
