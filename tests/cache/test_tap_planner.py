"""Tap planning (spec §7.1, §13.1; issue 9: the prompt tail is exact at n − 1)."""

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.tap_planner import (
    SEMANTIC_PROXIMITY_TOKENS,
    HintKind,
    Placement,
    PlannedTap,
    TapHint,
    TapOptions,
    TapSource,
    derive_tap_options,
    plan_taps,
)

RANK = {
    TapSource.EXPLICIT: 1,
    TapSource.OPENER: 2,
    TapSource.STRUCTURAL: 3,
    TapSource.AUTOMATIC: 3,
    TapSource.PROMPT_TAIL: 4,
    TapSource.LADDER: 5,
    TapSource.HEDGE: 6,
}


def options(max_new_taps: int = 8, ladder_tokens: int = 4096, min_gap_tokens: int = 2048,
            hedges: bool = False) -> TapOptions:
    """Hedges off unless asked for: most tests here are about the other sources (hedges have their own)."""
    return TapOptions(max_new_taps=max_new_taps, ladder_tokens=ladder_tokens, min_gap_tokens=min_gap_tokens,
                      hedges=hedges)


def hint(position: int, kind: HintKind) -> TapHint:
    return TapHint(position, kind)


def positions(taps: list[PlannedTap]) -> list[int]:
    return [tap.position for tap in taps]


def tap_at(taps: list[PlannedTap], position: int) -> PlannedTap:
    matches = [tap for tap in taps if tap.position == position]
    assert matches, f"no tap at {position}; planned {positions(taps)}"
    return matches[0]


def sources(taps: list[PlannedTap]) -> list[TapSource]:
    return [tap.source for tap in taps]


# ---------------------------------------------------------------- stories


def test_chat_turn_the_opener_absorbs_the_prompt_tail_within_64_tokens():
    # system block ends at 300, a user message at 4500, the generation opener at 9000, prompt of 9010.
    hints = [
        hint(300, HintKind.STRUCTURAL),
        hint(4500, HintKind.MESSAGE),
        hint(9000, HintKind.OPENER),
    ]
    taps = plan_taps(9010, 0, hints, [], options())
    assert positions(taps) == [300, 4480, 9000]
    # semantic taps lie at their token (a snapshot inside a block resumes bit-exactly), inside the pass
    assert tap_at(taps, 300) == PlannedTap(300, Placement.INNER, TapSource.STRUCTURAL, True)
    # ladder n − G = 4914 snaps back to the message boundary at 4500, then down to a block boundary
    assert tap_at(taps, 4480) == PlannedTap(4480, Placement.FLEXIBLE, TapSource.LADDER, False)
    assert tap_at(taps, 9000) == PlannedTap(9000, Placement.INNER, TapSource.OPENER, False)
    assert TapSource.PROMPT_TAIL not in sources(taps)


def test_the_prompt_tail_is_at_n_minus_1_and_taken_inside_its_pass():
    taps = plan_taps(3000, 0, [hint(2000, HintKind.OPENER)], [], options())
    assert tap_at(taps, 2999) == PlannedTap(2999, Placement.INNER, TapSource.PROMPT_TAIL, False)
    assert positions(taps) == [2000, 2999]


def test_a_tail_at_or_before_the_base_plans_no_tail():
    assert plan_taps(3000, 2999, [], [2999], options(), resumed_from_endpoint=True) == []


def test_a_short_user_turn_keeps_both_the_system_end_and_the_opener():
    # system end at 470 and opener at 500: each where later requests diverge (another session sharing the
    # system prompt, the next turn of this one); the tail at 502 lies within 64 tokens and is absorbed
    taps = plan_taps(503, 0, [hint(470, HintKind.STRUCTURAL), hint(500, HintKind.OPENER)], [], options())
    assert taps == [
        PlannedTap(470, Placement.INNER, TapSource.STRUCTURAL, True),
        PlannedTap(500, Placement.INNER, TapSource.OPENER, False),
    ]


def test_hints_at_one_position_are_one_tap_with_the_best_source_and_any_boundary():
    taps = plan_taps(610, 0, [hint(500, HintKind.STRUCTURAL), hint(500, HintKind.OPENER)], [], options())
    assert taps == [
        PlannedTap(500, Placement.INNER, TapSource.OPENER, True),
        PlannedTap(609, Placement.INNER, TapSource.PROMPT_TAIL, False),
    ]


def test_the_tail_survives_more_than_64_tokens_after_the_opener():
    taps = plan_taps(610, 0, [hint(500, HintKind.STRUCTURAL), hint(540, HintKind.OPENER)], [], options())
    assert positions(taps) == [500, 540, 609]
    assert sources(taps) == [TapSource.STRUCTURAL, TapSource.OPENER, TapSource.PROMPT_TAIL]


def test_an_automatic_marker_plans_like_structure_but_publishes_as_an_ordinary_tap():
    taps = plan_taps(5000, 0, [hint(1000, HintKind.AUTOMATIC)], [], options(max_new_taps=1))
    assert taps == [PlannedTap(1000, Placement.INNER, TapSource.AUTOMATIC, False)]


def test_an_endpoint_resume_skips_the_opener_but_keeps_the_tail():
    # the previous turn ended at 6100 (endpoint snapshot); this prompt echoes it and adds a tool result
    hints = [hint(300, HintKind.STRUCTURAL), hint(6800, HintKind.OPENER)]
    resumed = plan_taps(6810, 6100, hints, [6100], options(), resumed_from_endpoint=True)
    assert resumed == [PlannedTap(6809, Placement.INNER, TapSource.PROMPT_TAIL, False)]
    from_a_tap = plan_taps(6810, 6100, hints, [6100], options(), resumed_from_endpoint=False)
    assert sources(from_a_tap) == [TapSource.OPENER]


def test_a_deep_edit_reuses_a_ladder_tap_no_farther_back_than_the_edit_is_from_the_end():
    n, ladder = 100_000, 4096
    taps = plan_taps(n, 0, [], [], options(ladder_tokens=ladder, min_gap_tokens=1024))
    ladder_taps = [tap.position for tap in taps if tap.source == TapSource.LADDER]
    assert ladder_taps == [(n - ladder * 2**k) // 64 * 64 for k in (4, 3, 2, 1, 0)]
    for edit in (99_000, 90_000, 70_000, 40_000):
        reuse = max(p for p in [*ladder_taps, 0] if p <= edit)
        assert edit - reuse < max(n - edit, ladder) + BLOCK_TOKENS


def test_a_ladder_candidate_inside_a_media_span_moves_to_the_span_start():
    # n − G = 5904 lies inside an image spanning [5500, 6200)
    taps = plan_taps(10_000, 0, [], [], options(), exclusions=[(5500, 6200)])
    assert 5440 in positions(taps)
    assert all(not 5500 < p < 6200 for p in positions(taps))


def test_a_prompt_ending_inside_media_has_no_tail_tap():
    taps = plan_taps(1000, 0, [], [], options(), exclusions=[(900, 1200)])
    assert taps == []


def test_existing_snapshots_on_the_path_make_nearby_candidates_redundant():
    # structure at 2000 and opener at 2990 sit on or within 4 tokens after existing snapshots, and the
    # tail at 2999 within 64
    hints = [hint(2000, HintKind.STRUCTURAL), hint(2990, HintKind.OPENER)]
    taps = plan_taps(3000, 0, hints, [1998, 2900, 2987], options())
    assert taps == []


def test_explicit_markers_ignore_proximity_but_never_repeat_a_frontier():
    hints = [hint(1000, HintKind.EXPLICIT), hint(1070, HintKind.EXPLICIT), hint(1090, HintKind.EXPLICIT)]
    taps = plan_taps(1100, 0, hints, [1090], options())
    assert positions(taps) == [1000, 1070]  # 1090 repeats an existing snapshot; the tail is near it
    assert all(tap.boundary and tap.placement == Placement.INNER for tap in taps)


def test_the_budget_keeps_the_highest_priority_then_the_earliest():
    explicit = [hint(1000 * k + 10, HintKind.EXPLICIT) for k in range(1, 11)]
    taps = plan_taps(20_000, 0, [*explicit, hint(19_990, HintKind.OPENER)], [], options(max_new_taps=8))
    assert sources(taps) == [TapSource.EXPLICIT] * 8
    assert positions(taps) == [1000 * k + 10 for k in range(1, 9)]


def test_without_a_host_tier_two_taps_go_to_the_opener_and_the_structure():
    hints = [hint(700, HintKind.STRUCTURAL), hint(30_000, HintKind.OPENER)]
    taps = plan_taps(30_100, 0, hints, [], derive_tap_options(2048, host_tier=False))
    assert sources(taps) == [TapSource.STRUCTURAL, TapSource.OPENER]


def test_nothing_is_planned_at_or_past_the_tail_or_with_no_budget():
    assert plan_taps(5000, 4999, [hint(4990, HintKind.EXPLICIT)], [], options()) == []
    assert plan_taps(1, 0, [], [], options()) == []
    assert plan_taps(5000, 0, [hint(1000, HintKind.EXPLICIT)], [], options(max_new_taps=0)) == []


def test_derived_options_follow_the_configuration_rules():
    assert derive_tap_options(2048, host_tier=True) == options(8, 4096, 2048, hedges=True)
    assert derive_tap_options(512, host_tier=False) == options(2, 4096, 1024, hedges=True)
    plain = derive_tap_options(4096, True, max_new_taps=3, min_gap_tokens=0, hedges=False)
    assert plain == options(3, 8192, 0)
    assert derive_tap_options(2048, True, hedge_cold_prompts=True).hedge_cold_prompts
    with pytest.raises(ValueError):
        derive_tap_options(0, True)


@pytest.mark.parametrize(
    "fields",
    [
        {"max_new_taps": -1, "ladder_tokens": 4096, "min_gap_tokens": 0},
        {"max_new_taps": 1, "ladder_tokens": 63, "min_gap_tokens": 0},
        {"max_new_taps": 1, "ladder_tokens": 4096, "min_gap_tokens": -1},
    ],
)
def test_out_of_range_options_are_rejected(fields):
    with pytest.raises(ValueError):
        TapOptions(**fields)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError):
        plan_taps(100, 101, [], [], options())
    with pytest.raises(ValueError):
        plan_taps(100, 0, [hint(101, HintKind.OPENER)], [], options())
    with pytest.raises(ValueError):
        plan_taps(100, 0, [], [], options(), exclusions=[(50, 40)])


# ---------------------------------------------------------------- properties


@st.composite
def planning_inputs(draw):
    n = draw(st.integers(min_value=0, max_value=60_000))
    base = draw(st.integers(min_value=0, max_value=n))
    position = st.integers(min_value=0, max_value=n)
    hints = draw(st.lists(st.builds(TapHint, position, st.sampled_from(list(HintKind))), max_size=12))
    existing = draw(st.lists(position, max_size=5))
    spans = draw(
        st.lists(
            st.tuples(position, st.integers(min_value=0, max_value=3000)).map(lambda s: (s[0], s[0] + s[1])),
            max_size=3,
        )
    )
    opts = TapOptions(
        max_new_taps=draw(st.integers(min_value=0, max_value=10)),
        ladder_tokens=draw(st.integers(min_value=BLOCK_TOKENS, max_value=8192)),
        min_gap_tokens=draw(st.integers(min_value=0, max_value=4096)),
        hedge_cold_prompts=draw(st.booleans()),
    )
    resumed = draw(st.booleans())
    return n, base, hints, existing, spans, opts, resumed


def plan(inputs, **override):
    n, base, hints, existing, spans, opts, resumed = inputs
    return plan_taps(
        n, base, hints, existing, override.get("options", opts), spans, resumed_from_endpoint=resumed
    )


@settings(max_examples=300, deadline=None)
@given(planning_inputs())
def test_every_tap_is_in_bounds_outside_media_and_hedges_and_ladder_aligned(inputs):
    n, base, _hints, existing, spans, opts, _ = inputs
    taps = plan(inputs)
    assert positions(taps) == sorted(set(positions(taps)))
    assert len(taps) <= opts.max_new_taps
    for tap in taps:
        assert base < tap.position <= n - 1
        assert all(not start < tap.position < end for start, end in spans)
        assert tap.position not in existing
        if tap.source in (TapSource.HEDGE, TapSource.LADDER):
            assert tap.position % BLOCK_TOKENS == 0
        if tap.source == TapSource.PROMPT_TAIL:
            assert tap.position == n - 1
        assert tap.placement == (Placement.FLEXIBLE if tap.source == TapSource.LADDER else Placement.INNER)


@settings(max_examples=300, deadline=None)
@given(planning_inputs())
def test_taps_are_deduplicated_against_the_path_and_the_ladder_keeps_its_gap(inputs):
    _n, base, _hints, existing, _spans, opts, resumed = inputs
    taps = plan(inputs)
    anchors = [base, *existing]
    for tap in taps:
        if tap.source != TapSource.EXPLICIT:
            # the prompt tail may lie close past the base (never beside a snapshot); semantic taps keep
            # only a few tokens from the tap before them
            near = existing if tap.source == TapSource.PROMPT_TAIL else anchors
            semantic = tap.source in (TapSource.OPENER, TapSource.STRUCTURAL, TapSource.AUTOMATIC)
            gap = SEMANTIC_PROXIMITY_TOKENS if semantic else BLOCK_TOKENS
            assert all(not 0 <= tap.position - a <= gap for a in near), (tap, anchors)
        if tap.source == TapSource.LADDER:
            others = anchors + [t.position for t in taps if t is not tap]
            assert all(abs(tap.position - a) >= opts.min_gap_tokens for a in others)
        if resumed:
            assert tap.source != TapSource.OPENER
        if tap.source in (TapSource.EXPLICIT, TapSource.STRUCTURAL):
            assert tap.boundary
        if tap.source in (TapSource.LADDER, TapSource.PROMPT_TAIL):
            assert not tap.boundary


@settings(max_examples=200, deadline=None)
@given(planning_inputs())
def test_the_ladder_stays_within_log2_n_over_g_plus_one(inputs):
    n, _base, _hints, _existing, _spans, opts, _ = inputs
    ladder = [tap for tap in plan(inputs) if tap.source == TapSource.LADDER]
    bound = math.log2(n / opts.ladder_tokens) + 1 if n > opts.ladder_tokens else 0
    assert len(ladder) <= bound


@settings(max_examples=200, deadline=None)
@given(planning_inputs(), st.integers(min_value=0, max_value=9))
def test_a_smaller_budget_keeps_a_highest_priority_subset(inputs, budget):
    opts = inputs[5]
    unlimited = plan(
        inputs,
        options=TapOptions(
            max_new_taps=64, ladder_tokens=opts.ladder_tokens, min_gap_tokens=opts.min_gap_tokens,
            hedge_cold_prompts=opts.hedge_cold_prompts,
        ),
    )
    limited = plan(
        inputs,
        options=TapOptions(
            max_new_taps=budget, ladder_tokens=opts.ladder_tokens, min_gap_tokens=opts.min_gap_tokens,
            hedge_cold_prompts=opts.hedge_cold_prompts,
        ),
    )
    assert set(limited) <= set(unlimited)
    assert len(limited) == min(budget, len(unlimited))
    dropped = set(unlimited) - set(limited)
    if limited and dropped:
        assert max(RANK[t.source] for t in limited) <= min(RANK[t.source] for t in dropped)


@settings(max_examples=150, deadline=None)
@given(planning_inputs(), st.randoms(use_true_random=False))
def test_planning_is_deterministic_and_ignores_input_order(inputs, rng: random.Random):
    n, base, hints, existing, spans, opts, resumed = inputs
    first = plan(inputs)
    assert plan(inputs) == first
    shuffled_hints, shuffled_existing, shuffled_spans = list(hints), list(existing), list(spans)
    rng.shuffle(shuffled_hints)
    rng.shuffle(shuffled_existing)
    rng.shuffle(shuffled_spans)
    assert plan((n, base, shuffled_hints, shuffled_existing, shuffled_spans, opts, resumed)) == first


@settings(max_examples=150, deadline=None)
@given(planning_inputs())
def test_explicit_markers_win_over_everything_else(inputs):
    n, base, hints, existing, spans, opts, _ = inputs
    taps = plan(inputs)
    explicit = [t.position for t in taps if t.source == TapSource.EXPLICIT]
    only_explicit = plan_taps(
        n, base, [h for h in hints if h.kind == HintKind.EXPLICIT], existing, opts, spans
    )
    assert explicit == [t.position for t in only_explicit if t.source == TapSource.EXPLICIT]


def test_plain_position_kind_pairs_from_the_frontend_plan_like_hints():
    pairs = [(300, int(HintKind.STRUCTURAL)), (4500, int(HintKind.MESSAGE)), (9000, int(HintKind.OPENER))]
    typed = [hint(300, HintKind.STRUCTURAL), hint(4500, HintKind.MESSAGE), hint(9000, HintKind.OPENER)]
    assert plan_taps(9010, 0, pairs, [], options()) == plan_taps(9010, 0, typed, [], options())
    with pytest.raises(ValueError):
        plan_taps(9010, 0, [(300, 42)], [], options())


# --- hedges (issue 19) ---------------------------------------------------------------------------------

def test_a_token_id_prompt_gets_aligned_hedges_before_its_end_taken_inside_the_pass():
    n = 11_341  # trace_0291 request 21: it shares 11,136 tokens with an earlier prompt
    taps = plan_taps(n, 64, [], [], options(hedges=True))  # resumed after its first block
    hedges = [t.position for t in taps if t.source == TapSource.HEDGE]
    # n-2048, n-1024, n-512, n-256, each floored to 64, and the last block boundary below the tail
    assert hedges == [9280, 10304, 10816, 11072, 11328]
    assert all(t.placement == Placement.INNER and not t.boundary for t in taps if t.source == TapSource.HEDGE)
    assert tap_at(taps, 11_340).source == TapSource.PROMPT_TAIL
    # the ladder keeps its taps (n - 4096 and n - 8192 are at least the min gap from every hedge)
    assert [t.position for t in taps if t.source == TapSource.LADDER] == [3136, 7232]
    # a request sharing 11,136 tokens with it now resumes at 11,072 instead of the ladder's 7,232
    assert max(p for p in positions(taps) if p <= 11_136) == 11_072


def test_the_last_block_boundary_below_the_tail_is_hedged_where_a_rewritten_last_block_diverges():
    # A WEKA trace's next request re-hashes this prompt's partial last block [11_328, 11_341): it shares
    # 11_328 tokens with this prompt and resumes there, not at the n-256 hedge 256 tokens earlier.
    taps = plan_taps(11_341, 9_000, [], [], options(hedges=True))
    assert tap_at(taps, 11_328).source == TapSource.HEDGE
    # A prompt that fills its last block: the boundary below the tail is that block's start.
    assert tap_at(plan_taps(1_024, 64, [], [], options(hedges=True)), 960).source == TapSource.HEDGE
    # When the tail itself lies on a block boundary, the hedge goes to the last whole block's start: the
    # traces re-hash that block then (trace_0086: a 31,681-token request, the next diverges at 31,616).
    taps = plan_taps(31_681, 30_521, [], [], options(hedges=True))
    assert tap_at(taps, 31_680).source == TapSource.PROMPT_TAIL
    assert tap_at(taps, 31_616).source == TapSource.HEDGE


def test_a_long_cold_prompt_keeps_its_ladder_and_drops_its_farthest_hedge_when_the_budget_binds():
    budgeted = TapOptions(max_new_taps=8, ladder_tokens=4096, min_gap_tokens=2048, hedges=True,
                          hedge_cold_prompts=True)
    # trace_0086's first prompt: trace_0121 diverges from it at 9,088, between two ladder rungs
    taps = plan_taps(15_422, 0, [hint(15_168, HintKind.STRUCTURAL)], [], budgeted)
    assert [t.position for t in taps if t.source == TapSource.LADDER] == [7168, 11264]
    assert [t.position for t in taps if t.source == TapSource.HEDGE] == [14336, 14848, 15104, 15360]
    assert len(taps) == budgeted.max_new_taps  # n - 2048 (13,312) is the one left out


def test_hedges_lie_past_the_base_and_never_within_64_tokens_after_the_base_or_a_snapshot():
    hedged = options(hedges=True)
    assert positions(plan_taps(1_000, 600, [], [], hedged)) == [704, 960, 999]  # n-512 < base
    assert positions(plan_taps(1_000, 650, [], [], hedged)) == [960, 999]  # 704 is within 64 of the base
    assert positions(plan_taps(1_000, 64, [], [700], hedged)) == [448, 960, 999]  # 704 beside a snapshot
    assert positions(plan_taps(1_000, 940, [], [], hedged)) == [999]  # 960 is within 64 of the base
    assert positions(plan_taps(200, 64, [], [], hedged)) == [192, 199]  # only the last block boundary


def test_a_prompt_that_resumes_nothing_is_hedged_only_where_hedges_have_a_host_budget():
    hedged = options(hedges=True)
    assert positions(plan_taps(11_341, 0, [], [], hedged)) == [3136, 7232, 11_340]  # ladder and tail
    assert sources(plan_taps(11_341, 0, [], [], hedged)) == [
        TapSource.LADDER, TapSource.LADDER, TapSource.PROMPT_TAIL
    ]
    assert TapSource.HEDGE in sources(plan_taps(11_341, 64, [], [], hedged))
    # trace_0291's sub-agent 1 opens cold with 11,353 tokens; sub-agent 2 shares 11,136 of them
    budgeted = TapOptions(max_new_taps=8, ladder_tokens=4096, min_gap_tokens=2048, hedges=True,
                          hedge_cold_prompts=True)
    taps = plan_taps(11_353, 0, [], [], budgeted)
    assert [t.position for t in taps if t.source == TapSource.HEDGE] == [9280, 10304, 10816, 11072, 11328]
    assert max(p for p in positions(taps) if p <= 11_136) == 11_072
    no_hedges = TapOptions(max_new_taps=8, ladder_tokens=4096, min_gap_tokens=2048, hedges=False,
                           hedge_cold_prompts=True)
    assert TapSource.HEDGE not in sources(plan_taps(11_353, 0, [], [], no_hedges))


def test_without_a_host_tier_the_two_taps_go_to_structure_and_the_tail_not_to_hedges():
    hints = [hint(700, HintKind.STRUCTURAL)]
    taps = plan_taps(30_100, 0, hints, [], derive_tap_options(2048, host_tier=False))
    assert sources(taps) == [TapSource.STRUCTURAL, TapSource.PROMPT_TAIL]
