"""kill -9 trials of `hybridcache serve --cache-dir` on the tiny checkpoint (tools/crash_trials.py).

The fast test runs one trial (a kill while a compaction's temporary file exists); the slow one runs the
issue's 20, every kill mode five times."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridcache.tools.crash_trials import MODES, TrialSettings, run_trials


def _assert_every_trial_passed(results, lines):
    failed = [line for line, result in zip(lines, results, strict=True) if not result.passed]
    assert not failed, "\n".join(failed)
    assert all(result.started for result in results)
    assert sum(result.wrong_replies for result in results) == 0


async def test_a_kill_trial_restarts_verifies_and_serves_the_cold_replies(
    tiny_checkpoint: Path, tmp_path: Path
):
    lines: list[str] = []
    settings = TrialSettings(
        checkpoint=tiny_checkpoint, workdir=tmp_path, trials=1, conversations=2, turns=2, words_per_turn=80,
        modes=("mid-compaction",),
    )
    results = await run_trials(settings, report=lines.append)
    _assert_every_trial_passed(results, lines[1:])
    assert results[0].mode == "mid-compaction"


@pytest.mark.slow
async def test_twenty_kill_trials(tiny_checkpoint: Path, tmp_path: Path):
    lines: list[str] = []
    settings = TrialSettings(checkpoint=tiny_checkpoint, workdir=tmp_path, trials=20, modes=MODES)
    results = await run_trials(settings, report=lines.append)
    _assert_every_trial_passed(results, lines[1:])
    assert sum(result.mid_compaction for result in results) >= 1
    assert sum(result.durable for result in results) >= 5  # how many finished before the kill is random
