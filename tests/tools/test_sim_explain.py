"""`simulate --explain` (sim/explain.py): needed snapshots deleted, and the host census beside them."""

from __future__ import annotations

from hybridcache.tools import simulate as simulate_cli
from hybridcache.tools.sim.explain import SAMPLE_EVERY
from hybridcache.tools.sim.runner import Simulation, simulate_explained
from hybridcache.tools.traces import load_trace
from tests.tools.test_simulate import config, story_traces


def _needed_deletions(report) -> int:
    return (report.needed_deleted_hedge + report.needed_deleted_newest + report.needed_deleted_parent
            + report.needed_deleted_middle)


def test_explain_counts_needed_deletions_and_samples_the_host(tmp_path):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    tight = config(host_cache_mib=1, device_pages=40, users=1)
    result, report = simulate_explained(trace, tight)
    assert result.counters == Simulation(trace, tight).run().counters  # the first run's numbers
    counted = _needed_deletions(report)
    assert counted > 0
    assert report.needed_deleted_device_only <= counted
    lineage = counted - report.needed_deleted_hedge
    assert report.censuses == -(-lineage // SAMPLE_EVERY)
    assert report.host_images_never_needed_mib >= 0 and report.host_images_needed_mib >= 0
    _, no_host = simulate_explained(trace, config(host_cache_mib=0, device_pages=30, users=2))
    assert no_host.needed_deleted_parent > 0  # without a host tier a lineage's parent snapshot goes too
    assert no_host.needed_deleted_device_only == _needed_deletions(no_host)
    assert no_host.censuses == -(-(_needed_deletions(no_host) - no_host.needed_deleted_hedge) // SAMPLE_EVERY)
    _, roomy = simulate_explained(trace, config(host_cache_mib=64, device_pages=512, users=2))
    assert _needed_deletions(roomy) == 0 and roomy.censuses == 0


def test_cli_explain_prints_its_lines_for_ours_only(tmp_path, capsys):
    paths = [str(p) for p in story_traces(tmp_path)]
    tight = ["--model-shape", "tiny", "--host-cache-mib", "1", "--device-pages", "40", "--users", "1"]
    assert simulate_cli.main([*paths, *tight, "--explain"]) == 0
    values = dict(line.split("=", 1) for line in capsys.readouterr().out.strip().splitlines())
    roles = ("hedge", "newest", "parent", "middle")
    assert sum(int(values[f"explain_needed_deleted_{role}"]) for role in roles) > 0
    assert "computed_tokens" in values and "explain_host_kv_never_needed_mib" in values
    assert simulate_cli.main([*paths, *tight, "--explain", "--policy", "lru"]) == 2
    assert "ours policy only" in capsys.readouterr().err
