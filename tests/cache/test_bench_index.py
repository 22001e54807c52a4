"""`hybridcache bench index` runs end to end on small sizes and prints every name=value line."""

import argparse

from hybridcache.tools import bench_index

EXPECTED = {
    "match_240k_ms",
    "match_240k_first_ms",
    "insert_240k_ms",
    "events_per_s",
    "events_per_s_device_full",
    "evict_plan_us",
    "match_vs_dict_ratio",
}


def test_the_index_benchmark_prints_every_measurement(capsys):
    parser = argparse.ArgumentParser()
    bench_index.add_arguments(parser)
    small = ["--blocks", "40", "--snapshots", "4", "--repeat", "3", "--evict-snapshots", "20"]
    args = parser.parse_args(small)
    assert bench_index.run(args) == 0
    lines = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert set(lines) >= EXPECTED
    assert all(float(lines[name]) > 0 for name in EXPECTED)


def test_the_profile_flag_prints_the_fold_profile_to_stderr_and_keeps_stdout_parseable(capsys):
    parser = argparse.ArgumentParser()
    bench_index.add_arguments(parser)
    small = ["--blocks", "40", "--snapshots", "4", "--repeat", "3", "--evict-snapshots", "20"]
    assert bench_index.run(parser.parse_args([*small, "--profile", "5"])) == 0
    captured = capsys.readouterr()
    assert set(dict(line.split("=", 1) for line in captured.out.splitlines())) >= EXPECTED
    assert "tottime" in captured.err and "hybridcache/cache/" in captured.err  # the index functions listed
