"""The token-exact infinite-cache bound of `bench trace` (`trace_bound`): hand-checked prompts, a brute-force
property check, the per-conversation report, and WEKA sub-agents replayed inline in their root's lane."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.tools.trace_bound import Evaluated, bound_report, prompt_bounds
from hybridcache.tools.trace_plan import PlanLimits, plan_replay
from hybridcache.tools.traces import load_trace

WEKA = Path(__file__).parent / "fixtures" / "weka_alpha.json"

A = list(range(1000, 1150))  # 150 tokens: two full blocks and a 22-token tail


def test_the_bound_of_hand_checked_prompts():
    prompts = [
        ("a", A),
        ("b", A[:130] + [7] * 20),  # leaves A two tokens into A's partial tail: 150 - 130
        ("c", list(A)),  # A again: everything but the last token is shared
        ("d", [5] * 10),  # nothing in common
        ("e", A[:100]),  # inside A's second block, shorter than A: 1 token still computed
        ("f", [*A[:140], 1]),  # 140 shared, ending inside the tail block A had
        ("g", [5] * 9 + [6] + [5] * 70),  # 9 in common with d's 10-token (partial) block
        ("h", A[:64] + [9] * 64),  # exactly one block in common
    ]
    bounds = prompt_bounds(prompts)
    assert [b.shared for b in bounds] == [0, 130, 150, 0, 100, 140, 9, 64]
    assert [b.bound for b in bounds] == [150, 20, 1, 10, 1, 1, 71, 64]
    assert [b.shared_with for b in bounds] == [None, "a", "a", None, "a", "a", "d", "a"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=300), min_size=1, max_size=8))
def test_the_bound_is_the_longest_common_prefix_with_any_earlier_prompt(raw):
    # Prompts over a 3-token alphabet that mostly extend one another, so prefixes are shared at every offset.
    prompts = []
    for index, tail in enumerate(raw):
        base = prompts[index // 2][1][: len(tail) * 2] if prompts else []
        prompts.append((index, base + tail))
    for (key, tokens), got in zip(prompts, prompt_bounds(prompts)):
        earlier = [t for k, t in prompts if k < key]
        shared = max((_common(tokens, other) for other in earlier), default=0)
        assert got.shared == shared, (key, got, shared)
        assert got.bound == max(1, len(tokens) - min(shared, len(tokens) - 1))


def _common(left: list[int], right: list[int]) -> int:
    count = 0
    for x, y in zip(left, right):
        if x != y:
            break
        count += 1
    return count


def test_the_report_sums_per_conversation_and_lists_the_late_requests():
    bounds = prompt_bounds([("x1", A), ("x2", A + [3] * 300), ("y1", A[:128] + [4] * 200)])
    assert [b.bound for b in bounds] == [150, 300, 200]
    answered = [Evaluated("x1", "x", 150, 0), Evaluated("x2", "x", 450, 128), Evaluated("y1", "y", 328, 0)]
    summary, late = bound_report(bounds, answered)
    assert summary["bound_tokens"] == 650 and summary["evaluated_tokens"] == 150 + 322 + 328
    assert summary["evaluated_vs_bound"] == (150 + 322 + 328) / 650
    assert summary["bound.x.bound_tokens"] == 450 and summary["bound.x.evaluated_tokens"] == 472
    assert summary["bound.y.evaluated_vs_bound"] == 328 / 200
    # x2 evaluated 322 against 300 (within 64); y1 computed everything although it shares 128 with x1.
    assert [(r.key, r.resumed_at, r.diverges_at, r.shared_with) for r in late] == [("y1", 0, 128, "x1")]


def test_weka_sub_agent_requests_go_inline_in_their_roots_lane_in_trace_order():
    plan = plan_replay(load_trace(WEKA), PlanLimits(None, 4096, 8), (0, 256))
    assert len(plan.conversations) == 1
    lane = plan.conversations[0]
    sent = [(r.conversation == lane.id, r.arrival_s) for r in lane.requests]
    assert [arrival for _, arrival in sent] == sorted(arrival for _, arrival in sent)
    assert any(not own for own, _ in sent) and len(sent) == 6  # the sub-agent's requests are in the lane
