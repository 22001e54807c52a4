"""`bench_cache_dir` runs on micro and reports the durable directory's batches beside the time ratio."""

from __future__ import annotations

from pathlib import Path

from hybridcache.tools import bench_cache_dir


def test_the_bench_reports_ratios_and_fsync_batches(tmp_path: Path, capsys):
    assert bench_cache_dir.main(["--conversations", "1", "--turns", "2", "--turn-tokens", "150",
                                 "--workdir", str(tmp_path)]) == 0
    out = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    assert out["requests_per_side"] == "2" and float(out["request_time_ratio_median"]) > 0
    assert int(out["batches"]) >= 1 and int(out["records"]) >= 2
