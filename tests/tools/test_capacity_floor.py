"""The capacity floor (sim/capacity_floor.py): Belady by hand, and no policy computes less than it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridcache.tools import simulate as simulate_cli
from hybridcache.tools.sim.capacity_floor import AccessLog, belady_misses, next_access
from hybridcache.tools.sim.policies import Policy
from hybridcache.tools.sim.runner import Simulation
from hybridcache.tools.traces import load_trace
from tests.tools.test_simulate import config, story_traces, weka_request, write_weka

NEVER = np.iinfo(np.int64).max


def test_next_access_and_first_access_by_hand():
    following, first = next_access(np.array([1, 2, 1, 3, 2, 1]))
    assert following.tolist() == [2, 4, 5, NEVER, NEVER, NEVER]
    assert first.tolist() == [True, True, False, True, False, False]


@pytest.mark.parametrize(("capacity", "misses"), [(0, 3), (1, 1), (2, 0)])
def test_belady_by_hand(capacity, misses):
    # A B A C B A. One block: keep A (needed at 2 and 5), so only B's return at 4 misses; none: every
    # return misses; two: A and B both stay (C is never needed again and is not cached).
    hashes = np.array([10, 20, 10, 30, 20, 10], dtype=np.uint64)
    assert belady_misses(hashes, np.ones(6, dtype=bool), capacity) == (misses, 0)


def test_an_output_block_seen_before_is_counted_as_a_repeat():
    # the second request's output holds block 10 again: whatever is held, decode computes it
    hashes = np.array([10, 20, 10], dtype=np.uint64)
    assert belady_misses(hashes, np.array([True, True, False]), 0) == (1, 1)


def test_the_floor_adds_64_tokens_per_unavoidable_miss():
    log = AccessLog()
    log.record([1, 2], 2, 2)
    log.record([3], 1, 1)
    log.record([1, 2, 4], 3, 3)  # reuses 1 and 2: with room for one block, one of them misses
    floor = log.floor(1, unshared_tokens=300, bound_tokens=290)
    assert (floor.belady_misses, floor.output_repeats) == (1, 0)
    assert floor.tokens == 300 + 64
    assert log.floor(3, unshared_tokens=300, bound_tokens=290).tokens == 300
    assert log.floor(3, unshared_tokens=280, bound_tokens=290).tokens == 290  # never below the bound


def _floor_and_computed(trace, cfg):
    result = Simulation(trace, cfg).run()
    assert result.capacity_floor is not None
    return result.capacity_floor, result


@pytest.mark.parametrize("policy", list(Policy))
@pytest.mark.parametrize(("host_mib", "pages", "users"), [(1, 40, 1), (1, 40, 2), (0, 30, 2), (64, 512, 2)])
def test_no_policy_computes_less_than_the_floor_of_its_own_order(tmp_path, policy, host_mib, pages, users):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    floor, result = _floor_and_computed(
        trace, config(policy, host_cache_mib=host_mib, device_pages=pages, users=users, capacity_floor=True)
    )
    assert result.bound_tokens <= floor.tokens <= result.counters.computed_tokens


def test_a_tight_cache_has_a_floor_above_the_bound(tmp_path):
    # two conversations of 20 blocks each, alternating turns: 26 device pages and no host tier cannot
    # hold both, so the floor is above the infinite-cache bound
    a = [weka_request(10.0 * t, 64 * (20 + t) + 10, 4, list(range(1, 21 + t))) for t in range(3)]
    b = [weka_request(10.0 * t + 5, 64 * (20 + t) + 10, 4, list(range(100, 120 + t))) for t in range(3)]
    trace = load_trace([write_weka(tmp_path / "a.json", a), write_weka(tmp_path / "b.json", b)])
    floor, result = _floor_and_computed(
        trace, config(host_cache_mib=0, device_pages=26, max_concurrency=2, users=2, capacity_floor=True)
    )
    assert floor.belady_misses > 0
    assert result.bound_tokens < floor.tokens <= result.counters.computed_tokens


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 6), st.integers(0, 63), st.integers(1, 150)),
                   min_size=2, max_size=8),
    policy=st.sampled_from(list(Policy)),
    pages=st.integers(12, 60),
    echo=st.booleans(),
)
def test_random_conversations_never_beat_the_floor(tmp_path_factory, turns, policy, pages, echo):
    folder = tmp_path_factory.mktemp("floor")
    requests: list[list[dict]] = [[], []]
    blocks = [0, 0]
    for number, (who, grow, tail, out) in enumerate(turns):
        blocks[who] += grow
        ids = [1000 * who + i for i in range(1, blocks[who] + 1)]
        requests[who].append(weka_request(10.0 * number, blocks[who] * 64 + tail, out, ids))
    paths = [write_weka(folder / f"c{who}.json", reqs) for who, reqs in enumerate(requests) if reqs]
    trace = load_trace(paths)
    cfg = config(policy, assume_echo=echo, host_cache_mib=0, device_pages=pages, users=2, capacity_floor=True)
    floor, result = _floor_and_computed(trace, cfg)
    assert result.bound_tokens <= floor.tokens <= result.counters.computed_tokens


def test_cli_prints_the_floor_unless_asked_not_to(tmp_path, capsys):
    paths = [str(p) for p in story_traces(tmp_path)]
    tight = ["--model-shape", "tiny", "--host-cache-mib", "0", "--device-pages", "30", "--users", "2"]
    assert simulate_cli.main([*paths, *tight]) == 0
    values = dict(line.split("=", 1) for line in capsys.readouterr().out.strip().splitlines())
    floor, computed = int(values["capacity_floor_tokens"]), int(values["computed_tokens"])
    assert int(values["bound_tokens"]) <= floor <= computed
    assert float(values["computed_vs_capacity_floor"]) == pytest.approx(computed / floor, abs=1e-3)
    assert values["capacity_floor_blocks"] == "30"  # no host tier: the device pages alone
    assert simulate_cli.main([*paths, *tight, "--no-capacity-floor"]) == 0
    assert "capacity_floor_tokens" not in capsys.readouterr().out
