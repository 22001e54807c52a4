"""`hybridcache bench engine` on the micro checkpoint with tiny sizes: the scenario resumes where it means
to (device, then host), every line is printed, and the ratios are the quotients of the printed values.
Speed is not asserted: that is what the printed ratios are for."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from hybridcache.cli import main
from hybridcache.core.api import RequestAccounting
from hybridcache.tools.bench_engine import (
    TARGETS,
    Pair,
    Timed,
    host_resume_limit,
    pair_overheads,
    warn_if_busy,
)

PROMPT_TOKENS = 320
BENCH_FLAGS = [
    "--prompt-tokens", str(PROMPT_TOKENS), "--decode-tokens", "4", "--prefill-chunk", "128",
    "--host-cache-mib", "64", "--dtype", "float32", "--copy-mib", "8", "--repeats", "2", "--cold-runs", "3",
]  # fmt: skip


def parse_lines(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if "=" in line]
    return {name: value for name, value in pairs}


def accounting(reuse: int, restored: int, source: str = "host") -> RequestAccounting:
    return RequestAccounting(
        prompt_tokens=1000,
        reuse_tokens=reuse,
        cached_prefix_tokens=reuse,
        restored_host_bytes=restored,
        source=source,  # type: ignore[arg-type]
        prefill_tokens=1000 - reuse,
    )


def assert_ratio(lines: dict[str, str], ratio: str, numerator: str, denominator: str) -> None:
    expected = float(lines[numerator]) / float(lines[denominator])
    assert float(lines[ratio]) == pytest.approx(expected, rel=0.02), (ratio, lines[ratio], expected)


def assert_median_of_runs(lines: dict[str, str], ratio: str) -> None:
    runs = [float(value) for value in lines[f"runs.{ratio}"].split(",")]
    assert len(runs) == 3  # one per cold pair
    assert float(lines[ratio]) == pytest.approx(sorted(runs)[1], rel=1e-3), (ratio, lines[ratio], runs)


def cold(ttft_s: float, decode_tok_s: float, prefill_cpu_s: float, decode_cpu_s: float) -> Timed:
    return Timed(ttft_s, decode_tok_s, accounting(0, 0, "root"), prefill_cpu_s, decode_cpu_s)


@pytest.fixture(scope="module")
def bench_output(micro_checkpoint: Path) -> tuple[int, str, str]:
    """One run of the benchmark through the CLI: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["bench", "engine", "--checkpoint", str(micro_checkpoint), *BENCH_FLAGS])
    return status, out.getvalue(), err.getvalue()


def test_the_benchmark_runs_through_the_cli_and_prints_every_measurement(bench_output):
    status, out, err = bench_output
    assert status == 0, err
    lines = parse_lines(out)
    for name in (
        "copy_bandwidth_gb_s", "cold_ttft_ms", "cold_ttft_no_reuse_ms", "device_resume_ttft_ms",
        "host_resume_ttft_ms", "host_resume_limit_ms", "prefill_tok_s_cache_on", "prefill_tok_s_cache_off",
        "decode_tok_s_cache_on", "decode_tok_s_cache_off", "elapsed_s",
    ):  # fmt: skip
        assert float(lines[name]) > 0, name
    for name in TARGETS:
        assert lines[f"target.{name}"].startswith(("met", "MISSED")), name
    assert len(lines["runs.cold_ttft_ms"].split(",")) == 3  # every cold run, for the spread
    assert len(lines["runs.host_resume_ttft_ms"].split(",")) == 3
    for name in ("prefill_cache_overhead_cpu", "decode_cache_overhead_cpu", "cpus"):
        assert float(lines[name]) > 0, name
    assert float(lines["load_average_start"]) >= 0


def test_the_resumes_come_from_the_device_and_then_from_host_slabs(bench_output):
    _, out, err = bench_output
    lines = parse_lines(out)
    assert "warning" not in err, err  # every cold run was cold, every resume came from where it should
    tail_tap = PROMPT_TOKENS - 1  # the prompt-tail tap at n - 1
    assert int(lines["device_resume_reuse_tokens"]) == tail_tap
    assert int(lines["host_resume_reuse_tokens"]) == tail_tap
    assert int(lines["host_resume_restored_bytes"]) > 0
    assert int(lines["device_evictions"]) > 0


def test_the_ratios_are_the_quotients_of_the_printed_values(bench_output):
    lines = parse_lines(bench_output[1])
    assert_ratio(lines, "host_resume_vs_cold", "host_resume_ttft_ms", "cold_ttft_ms")
    assert_ratio(lines, "host_resume_vs_limit", "host_resume_ttft_ms", "host_resume_limit_ms")
    for kind in ("prefill", "decode"):
        assert_median_of_runs(lines, f"{kind}_cache_overhead")
        assert_median_of_runs(lines, f"{kind}_cache_overhead_cpu")


def test_each_pair_compares_the_two_engines_on_the_same_prompt_and_the_median_ignores_one_disturbed_pair():
    pairs = [
        Pair(on=cold(2.0, 10.0, 4.0, 0.2), off=cold(1.0, 20.0, 4.0, 0.2)),  # a disturbed cached run
        Pair(on=cold(1.0, 10.0, 4.4, 0.25), off=cold(1.0, 10.0, 4.0, 0.2)),
        Pair(on=cold(0.9, 12.0, 4.0, 0.2), off=cold(1.0, 10.0, 4.0, 0.2)),
    ]
    overheads = pair_overheads(pairs)
    assert overheads["prefill_cache_overhead"] == pytest.approx([0.5, 1.0, 1.0 / 0.9])
    assert overheads["decode_cache_overhead"] == pytest.approx([0.5, 1.0, 1.2])
    assert overheads["prefill_cache_overhead_cpu"] == pytest.approx([1.0, 4.0 / 4.4, 1.0])
    assert overheads["decode_cache_overhead_cpu"] == pytest.approx([1.0, 0.8, 1.0])
    assert sorted(overheads["prefill_cache_overhead"])[1] == pytest.approx(1.0)


def test_a_busy_machine_is_named_on_stderr(capsys):
    warn_if_busy(0.2, 2.1, cpus=2)
    assert capsys.readouterr().err == ""
    warn_if_busy(5.0, 7.0, cpus=2)
    assert "busy" in capsys.readouterr().err


def test_the_limit_is_the_suffix_prefill_plus_the_restored_bytes_at_copy_bandwidth():
    device = Timed(0.2, None, accounting(reuse=999, restored=0, source="device"))
    host = Timed(0.5, None, accounting(reuse=999, restored=3_000_000_000))
    assert host_resume_limit(host, device, bandwidth=1e10, prefill_tok_s=100.0) == pytest.approx(0.5)


def test_a_shallower_host_resume_adds_its_extra_suffix_at_the_cold_prefill_rate():
    device = Timed(0.2, None, accounting(reuse=999, restored=0, source="device"))
    host = Timed(0.5, None, accounting(reuse=959, restored=0))
    assert host_resume_limit(host, device, bandwidth=1e10, prefill_tok_s=100.0) == pytest.approx(0.6)


def test_bad_sizes_are_refused_before_anything_loads(micro_checkpoint: Path, capsys):
    status = main(["bench", "engine", "--checkpoint", str(micro_checkpoint), "--prompt-tokens", "64"])
    assert status == 2
    assert "--prompt-tokens" in capsys.readouterr().err
