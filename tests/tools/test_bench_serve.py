"""`hybridcache bench serve` on the micro checkpoint with tiny sizes: both servers answer every request,
only the cached one reports cached tokens, and the printed ratios are quotients of printed values. Speed
is not asserted: the printed ratios are the measurement."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cli import main
from hybridcache.tools.bench_serve import Sample, percentile, summarize

REQUESTS = 6
BENCH_FLAGS = [
    "--clients", "2", "--requests", str(REQUESTS), "--max-tokens", "4", "--system-words", "60",
    "--user-words", "6", "--overhead-repeats", "2", "--kv-pages", "256",
]  # fmt: skip


def parse_lines(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if "=" in line]
    return {name: value for name, value in pairs}


def assert_ratio(lines: dict[str, str], ratio: str, numerator: str, denominator: str) -> None:
    expected = float(lines[numerator]) / float(lines[denominator])
    assert float(lines[ratio]) == pytest.approx(expected, rel=0.01), (ratio, lines[ratio], expected)


def sample(ttft_s: float, gaps_s: tuple[float, ...], tokens: int, prompt: int, cached: int) -> Sample:
    return Sample(0.0, ttft_s, gaps_s, ttft_s + sum(gaps_s), len(gaps_s) + 1, tokens, prompt, cached)


@pytest.fixture(scope="module")
def bench_output(micro_checkpoint: Path) -> tuple[int, str, str]:
    """One run of the benchmark through the CLI: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["bench", "serve", "--checkpoint", str(micro_checkpoint), *BENCH_FLAGS])
    return status, out.getvalue(), err.getvalue()


def test_both_servers_answer_every_request_and_every_measurement_is_printed(bench_output):
    status, out, err = bench_output
    assert status == 0, err
    lines = parse_lines(out)
    for label in ("cache_on", "cache_off"):
        assert int(lines[f"{label}.requests_done"]) == REQUESTS
        for name in ("requests_per_s", "output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms"):
            assert float(lines[f"{label}.{name}"]) > 0, (label, name)
        assert float(lines[f"{label}.ttft_p99_ms"]) >= float(lines[f"{label}.ttft_p50_ms"])
        assert float(lines[f"{label}.itl_p99_ms"]) >= float(lines[f"{label}.itl_p50_ms"])
    assert float(lines["http_request_ms"]) > 0 and float(lines["submit_request_ms"]) > 0


def test_only_the_cached_server_serves_prompt_tokens_from_its_cache(bench_output):
    lines = parse_lines(bench_output[1])
    assert float(lines["cache_on.cached_token_share"]) > 0.2  # the shared system prompt and earlier turns
    assert float(lines["cache_off.cached_token_share"]) == 0


def test_the_ratios_are_quotients_of_the_printed_values(bench_output):
    lines = parse_lines(bench_output[1])
    assert_ratio(lines, "throughput_on_vs_off", "cache_on.requests_per_s", "cache_off.requests_per_s")
    assert_ratio(lines, "ttft_p50_on_vs_off", "cache_on.ttft_p50_ms", "cache_off.ttft_p50_ms")
    assert_ratio(lines, "http_overhead", "http_request_ms", "submit_request_ms")


def test_a_summary_reports_percentiles_rates_and_the_cached_share():
    samples = [sample(0.010, (0.002, 0.004), 3, 100, 50), sample(0.030, (0.006,), 2, 100, 0)]
    summary = summarize("run", samples, wall_s=0.5)
    assert summary["run.requests_per_s"] == pytest.approx(4.0)
    assert summary["run.output_tok_s"] == pytest.approx(10.0)
    assert summary["run.ttft_p50_ms"] == pytest.approx(20.0)
    assert summary["run.itl_p50_ms"] == pytest.approx(4.0)
    assert summary["run.cached_token_share"] == pytest.approx(0.25)
    assert summary["run.chunks_per_token"] == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=40), st.floats(0, 100), st.floats(0, 100))
def test_percentiles_stay_within_the_values_and_grow_with_q(values: list[float], q1: float, q2: float):
    low, high = sorted((q1, q2))
    assert min(values) <= percentile(values, low) <= percentile(values, high) <= max(values)
    assert percentile(values, 0) == min(values) and percentile(values, 100) == max(values)


def test_a_percentile_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
