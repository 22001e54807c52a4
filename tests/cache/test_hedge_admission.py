"""Hedges valued against their memory (cache/hedge_admission.py): host admission by value, the hedge
byte budget, and the early drop of hedges a later request resumed past."""

import pytest
from cache_factories import IMAGE, checked_cache, geometry, linear_cost, run_request, tokens

from hybridcache.cache.hedge_admission import (
    AUTO_HEDGE_HOST_SHARE,
    auto_hedge_budget,
    hedge_host_bytes,
    plan_hedge_budget,
    resolve_hedge_budget,
)
from hybridcache.cache.host_eviction import density_term, plan_host_room
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.records import Residency, SnapshotKind
from hybridcache.cache.write_back import HostWrite
from hybridcache.config import parse_hedge_budget


def hedge_cache(
    host_slabs: int = 200,
    budget: int | None = None,
    snapshot_slots: int = 6,
    host_write: HostWrite = HostWrite.THROUGH,
):
    geo = geometry(host_slabs=host_slabs, snapshot_slots=snapshot_slots)
    cache = checked_cache(geo, cost=linear_cost(), host_write=host_write)
    cache.hedge_budget_bytes = budget
    return cache


def hedges_of(cache):
    return [s for s in cache.index.snapshots.values() if s.kind == SnapshotKind.HEDGE]


def test_a_hedge_tap_publishes_a_hedge_written_to_free_host_room():
    cache = hedge_cache()
    run_request(cache, tokens(512, seed=1), hedges=[256], taps=[448])
    (hedge,) = hedges_of(cache)
    assert hedge.frontier == 256
    assert hedge.host_state == Residency.RESIDENT
    assert hedge_host_bytes(cache.index) == IMAGE
    assert cache.stats.hedge_writes_refused == 0
    others = [s for s in cache.index.snapshots.values() if s.kind != SnapshotKind.HEDGE]
    assert {s.kind for s in others} == {SnapshotKind.TAP, SnapshotKind.ENDPOINT}


def test_a_zero_budget_keeps_hedges_device_only_and_writes_everything_else():
    cache = hedge_cache(budget=0)
    run_request(cache, tokens(512, seed=1), hedges=[256])
    (hedge,) = hedges_of(cache)
    assert hedge.host_state == Residency.ABSENT and hedge.device_state == Residency.RESIDENT
    assert cache.stats.hedge_writes_refused == 1
    assert hedge_host_bytes(cache.index) == 0
    endpoint = next(s for s in cache.index.snapshots.values() if s.kind == SnapshotKind.ENDPOINT)
    assert endpoint.host_state == Residency.RESIDENT


def test_within_the_budget_a_hedge_displaces_a_hedge_worth_less_and_never_one_worth_more():
    # Budget of one image. A hedge saving 192 tokens over the root is worth more than one saving 64.
    cache = hedge_cache(budget=IMAGE)
    run_request(cache, tokens(512, seed=1), lane=0, hedges=[64])
    (cheap,) = hedges_of(cache)
    run_request(cache, tokens(512, seed=2), lane=1, hedges=[192])
    dear = next(s for s in hedges_of(cache) if s.frontier == 192)
    assert dear.host_state == Residency.RESIDENT
    assert cache.index.snapshots.get(cheap.id) is None or cheap.host_state == Residency.ABSENT
    assert hedge_host_bytes(cache.index) == IMAGE
    # The other way round: the cheap hedge finds the budget held by a dearer one and is not written.
    cache = hedge_cache(budget=IMAGE)
    run_request(cache, tokens(512, seed=2), lane=1, hedges=[192])
    run_request(cache, tokens(512, seed=1), lane=0, hedges=[64])
    by_frontier = {s.frontier: s for s in hedges_of(cache)}
    assert by_frontier[192].host_state == Residency.RESIDENT
    assert by_frontier[64].host_state == Residency.ABSENT
    assert cache.stats.hedge_writes_refused == 1


def test_plan_hedge_budget_by_hand():
    cache = hedge_cache()
    run_request(cache, tokens(512, seed=1), hedges=[128])
    (hedge,) = hedges_of(cache)
    index = cache.index
    assert plan_hedge_budget(index, IMAGE, 0, 2 * IMAGE, hedge.gdsf_h) == []  # fits beside it
    assert plan_hedge_budget(index, IMAGE, IMAGE, 2 * IMAGE, hedge.gdsf_h + 1) is not None  # batch counts
    assert plan_hedge_budget(index, IMAGE, 0, IMAGE, hedge.gdsf_h) is None  # worth as much: refused
    dropped = plan_hedge_budget(index, IMAGE, 0, IMAGE, hedge.gdsf_h + 1)
    assert dropped is not None and [e.snapshot for e in dropped] == [hedge.id]
    assert plan_hedge_budget(index, 2 * IMAGE, 0, IMAGE, float("inf")) is None  # larger than the budget


def test_a_full_host_takes_a_hedge_only_over_a_victim_worth_less():
    # Room for one image (write-back: blocks stay on the device): the first request's endpoint fills
    # it; a later hedge worth less than that endpoint must not evict it. (The second prompt ends within
    # 64 tokens of its hedge, so it publishes no endpoint that would take the room anyway.)
    cache = hedge_cache(host_slabs=4, host_write=HostWrite.BACK)
    _, _, a = run_request(cache, tokens(1024, seed=1), lane=0)
    endpoint = cache.index.snapshots[a.endpoint]
    assert endpoint.host_state == Residency.RESIDENT
    run_request(cache, tokens(100, seed=2), lane=1, hedges=[64])
    hedge = next(s for s in hedges_of(cache) if s.frontier == 64)
    assert density_term(hedge) < density_term(endpoint)
    assert cache.index.snapshots[a.endpoint].host_state == Residency.RESIDENT
    assert hedge.host_state == Residency.ABSENT
    assert cache.stats.hedge_writes_refused == 1


def test_plan_host_room_with_a_density_cap_refuses_to_evict_a_snapshot_worth_more_per_byte():
    cache = hedge_cache(host_slabs=4, host_write=HostWrite.BACK)
    _, _, a = run_request(cache, tokens(1024, seed=1), lane=0)
    index: PrefixIndex = cache.index
    density = density_term(index.snapshots[a.endpoint])
    assert density > 0
    want = index.host.num_free + 1
    assert plan_host_room(index, want, denser_than=density) is None
    assert plan_host_room(index, want, denser_than=density * 1.01) is not None
    assert plan_host_room(index, want) is not None


def test_a_hedge_stays_when_a_later_request_resumes_past_it_and_serves_a_sibling_after():
    # Two sub-agents spawned from one context: the first continues past the context's hedge, the
    # second diverges just after it and must still find it.
    cache = hedge_cache()
    history = tokens(512, seed=1)
    answer = tokens(64, seed=9)
    run_request(cache, history, lane=0, generated=answer, hedges=[256])
    (hedge,) = hedges_of(cache)
    quoted, _, _ = run_request(cache, history + answer + tokens(128, seed=2), lane=1)
    assert quoted.reuse_tokens > hedge.frontier
    assert hedge.id in cache.index.snapshots
    sibling = history[:300] + tokens(200, seed=3)
    quoted, _, _ = run_request(cache, sibling, lane=0)
    assert quoted.reuse_tokens == 256 and cache.index.snapshots[hedge.id].hits == 1


def test_the_journal_replays_hedges():
    journal: list = []
    geo = geometry(host_slabs=200, snapshot_slots=6)
    cache = checked_cache(geo, journal, linear_cost(), HostWrite.THROUGH)
    run_request(cache, tokens(512, seed=1), hedges=[256])
    fresh = PrefixIndex(cache.index.geometry)
    for event in journal:
        fresh.apply(event)
    assert fresh.checkpoint_digest() == cache.index.checkpoint_digest()
    assert [s.kind for s in fresh.snapshots.values()].count(SnapshotKind.HEDGE) == 1


def test_auto_budget_is_a_share_of_the_host_tier_when_an_image_is_worth_its_bytes():
    image, page = 106_764, 32_768  # tiny with its pending tail: an image is 3.3 pages
    assert auto_hedge_budget(image, 8 << 30, page) == int((8 << 30) * AUTO_HEDGE_HOST_SHARE)
    assert auto_hedge_budget(image, 1 << 20, page) == int((1 << 20) * AUTO_HEDGE_HOST_SHARE)


def test_auto_budget_is_zero_when_an_image_outweighs_the_kv_of_the_tokens_a_hedge_saves():
    # small (28 pages) and the 27B-INT8 shape (86 pages), pending tails included: more host bytes than
    # the KV of 256 tokens.
    assert auto_hedge_budget(21_860_424, 8 << 30, 786_432) == 0
    assert auto_hedge_budget(184_920_256, 64 << 30, 2_162_688) == 0
    assert auto_hedge_budget(4 * 4096, 1 << 30, 4096) > 0  # exactly the KV of 256 tokens
    geo = geometry(host_slabs=1 << 20, concurrency=4)  # an image of 3 slabs, 3 pages
    assert resolve_hedge_budget("auto", geo) == int(geo.host_cache_bytes * AUTO_HEDGE_HOST_SHARE)
    assert resolve_hedge_budget(12345, geo) == 12345


@pytest.mark.parametrize(
    ("text", "expected"), [("auto", "auto"), ("AUTO", "auto"), ("0", 0), ("512M", 512 << 20), ("2g", 2 << 30)]
)
def test_parse_hedge_budget(text, expected):
    assert parse_hedge_budget(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "1.5G", "12T", "lots"])
def test_parse_hedge_budget_refuses_nonsense(text):
    with pytest.raises(ValueError, match="auto or a number of bytes"):
        parse_hedge_budget(text)
