"""`hybridcache bench peer`: how rounds combine (the servers themselves are not started here)."""

from __future__ import annotations

from hybridcache.tools.bench_peer import SideResult, _best_of, _prompts


def test_rounds_keep_each_sides_best_speeds_and_largest_memory():
    slow = SideResult({2048: 100.0}, {2048: 8.0}, 10, 30, 40, 3.0)
    fast = SideResult({2048: 150.0}, {2048: 7.0}, 12, 25, 45, None)
    best = _best_of([slow, fast])
    assert best == SideResult({2048: 150.0}, {2048: 8.0}, 12, 30, 45, 3.0)
    assert _best_of([fast]).batched_vs_single is None


def test_each_round_gets_fresh_prompts_of_the_asked_lengths():
    first, second = _prompts([64, 128], 2, seed=1), _prompts([64, 128], 2, seed=2)
    assert [len(p) for p in first[64] + first[128]] == [64, 64, 128, 128]
    assert first == _prompts([64, 128], 2, seed=1)
    assert first[64][0] != second[64][0] and first[64][0] != first[64][1]
