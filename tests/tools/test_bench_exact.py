"""`hybridcache bench exact` on the micro checkpoint: every case resumes from the source it names, and the
resumed answers equal the cold ones bit for bit (in bf16, where a split inside a block used to show)."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pytest

from hybridcache.cli import main
from hybridcache.tools.bench_exact import Answer, build_cases, compare

FLAGS = ["--prompt-tokens", "200", "--decode-tokens", "8", "--prefill-chunk", "256", "--dtype", "bfloat16"]


def parse_lines(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if "=" in line]
    return {name: value for name, value in pairs}


@pytest.fixture(scope="module")
def bench_lines(micro_checkpoint: Path) -> dict[str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["bench", "exact", "--checkpoint", str(micro_checkpoint), *FLAGS])
    assert status == 0, err.getvalue()
    return parse_lines(out.getvalue())


def test_every_case_resumes_from_its_source_with_the_cold_runs_numbers(bench_lines):
    for case in build_cases(200, [[0] * 400] * 8):
        assert bench_lines[f"case.{case.name}.source"] == case.source, case.name
        reused = int(bench_lines[f"case.{case.name}.reuse_tokens"].split()[0])
        assert reused > 0, case.name
        if case.name.startswith(("device.repeat.unaligned", "device.extend.unaligned", "host.", "file.")):
            assert reused % 64 != 0, case.name  # the tail n - 1, inside a block
        assert bench_lines[f"case.{case.name}.max_logprob_diff"] == "0", case.name
    assert bench_lines["cache_max_logprob_diff"] == "0"
    assert bench_lines["chunking_max_logprob_diff"] == "0"
    assert bench_lines["greedy_tokens_matched"] == "56/56"
    assert bench_lines["top_token_sets_differ"] == "0"


def test_a_comparison_stops_at_the_first_differing_token_and_flags_differing_top_sets():
    cold = Answer([1, 2, 3], [{1: -0.5, 2: -1.0}, {2: -0.25}, {3: -0.1}], "root", 0)
    same = compare(cold, cold)
    assert same == (0.0, 3, 3, 0)
    drifted = Answer([1, 9, 3], [{1: -0.5, 2: -1.5}, {2: -0.25}, {7: -0.1}], "device", 64)
    result = compare(drifted, cold)
    assert result.max_diff == 0.5 and result.matched == 1 and result.total == 3
    other_set = Answer([1, 2, 3], [{1: -0.5, 5: -1.0}, {2: -0.25}, {3: -0.1}], "device", 64)
    assert math.isinf(compare(other_set, cold).max_diff)
