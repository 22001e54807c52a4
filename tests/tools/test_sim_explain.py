"""`simulate --explain` (sim/explain.py): needed snapshots deleted, and the host census beside them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

from hybridcache.tools import simulate as simulate_cli
from hybridcache.tools.sim.explain import SAMPLE_EVERY, CensusCache
from hybridcache.tools.sim.runner import Simulation, simulate_explained
from hybridcache.tools.traces import load_trace
from tests.tools.test_simulate import TINY, config, story_traces, weka_request, write_weka


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


class Request(NamedTuple):
    conversation: int
    turn: int


def test_never_needed_state_is_told_by_whether_its_last_user_finished():
    cache = CensusCache(TINY.geometry(64, 1, 2, 3))
    cache.know_future([(Request(0, 0), [1, 2]), (Request(1, 0), [1, 3]), (Request(0, 1), [1, 2, 4])])
    root = SimpleNamespace(lookup_hash=0, parent=None)
    node = {1: SimpleNamespace(lookup_hash=1, parent=root)}
    node[2] = SimpleNamespace(lookup_hash=2, parent=node[1])
    node[3] = SimpleNamespace(lookup_hash=3, parent=node[1])
    node[4] = SimpleNamespace(lookup_hash=4, parent=node[2])
    output = SimpleNamespace(lookup_hash=99, parent=node[3])  # a block no prompt holds: its parent's user
    assert cache.future.last_holder(1) is None and not cache.hindsight.ended(node[1])  # nobody held it yet
    cache.future.admitted(Request(0, 0))
    assert cache.future.last_holder(2) == 0
    assert not cache.hindsight.ended(node[2])  # conversation 0 has a request left
    cache.future.admitted(Request(1, 0))
    assert cache.future.last_holder(1) == 1 and cache.hindsight.ended(node[3])  # conversation 1 sent its last
    assert cache.hindsight.ended(output)
    assert cache.hindsight.ended(node[1]) and not cache.hindsight.ended(node[2])  # the latest holder decides
    cache.future.admitted(Request(0, 1))
    assert cache.hindsight.ended(node[2]) and cache.hindsight.ended(node[4])


def ended_conversations_trace(tmp_path):
    """Two more conversations beside the story's, one of them a single request: with a 2 MiB host and two
    users (``ENDED_TIGHT``), needed snapshots go while finished conversations' state sits on the host."""
    paths = story_traces(tmp_path)
    paths.append(write_weka(tmp_path / "gamma.json", [
        weka_request(0.0, 1200, 20, list(range(300, 318))),
        weka_request(400.0, 1500, 20, list(range(300, 323)))], prefix_tokens=128))
    paths.append(write_weka(tmp_path / "delta.json", [
        weka_request(0.0, 1000, 20, list(range(400, 415)))], prefix_tokens=128))
    return load_trace(paths, shared_prefix=True)


ENDED_TIGHT = config(host_cache_mib=2, device_pages=40, users=2)


def test_census_counts_finished_conversations_state_among_the_never_needed(tmp_path):
    _, report = simulate_explained(ended_conversations_trace(tmp_path), ENDED_TIGHT)
    assert report.censuses > 0
    assert 0 < report.host_kv_of_finished_mib <= report.host_kv_never_needed_mib
    assert 0 < report.host_images_of_finished_mib <= report.host_images_never_needed_mib
