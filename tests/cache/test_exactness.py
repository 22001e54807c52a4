"""Exactness marks: blocks and snapshots that decode steps produced are inexact, an exact resume stops
before them, and an exact prefill of the same tokens replaces their copies (``BlockMadeExact``) and their
snapshot (an exact one at the same key). Every event is checked by ``check_integrity``."""

from __future__ import annotations

import msgspec
import pytest
from cache_factories import checked_cache, prompt, tokens

from hybridcache.cache.facade import Cache
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.match import PromptInput, Readiness
from hybridcache.cache.records import Residency
from hybridcache.cache.resumable_cover import ResumableCover, Tier
from hybridcache.cache.write_back import HostWrite

PROMPT = 300


def exact(toks) -> PromptInput:
    return msgspec.structs.replace(prompt(toks), exact_only=True)


def serve(cache: Cache, toks, lane: int, computed: int, exact_tokens: int, taps=()) -> int | None:
    """A lane over ``toks[:computed]`` whose first ``exact_tokens`` positions are exact (its prefill);
    the rest came from decode. Taps at ``taps``; host writes land at once. Returns the endpoint snapshot
    id."""
    quoted = cache.quote(exact(toks))
    assert quoted.readiness == Readiness.READY
    cache.stage(quoted, lane)
    cache.activate(lane)
    have = len(cache.block_table(lane))
    need = -(-computed // BLOCK_TOKENS)
    if need > have:
        assert cache.allocate_growth_pages(lane, need - have) is not None
    for position in sorted(taps):
        cache.take_tap(lane, position)
    cache.commit_blocks(lane, toks[:computed], exact_tokens=exact_tokens)
    published = cache.publish_ready_taps(lane, toks[:computed], exact_tokens)
    finished = cache.finish(lane, toks[:computed], exact_tokens=exact_tokens)
    for write in (published.write, finished.write):
        if write is not None:
            cache.host_write_done(write.batch)  # the copies landed (a snapshot being written stays put)
    return finished.endpoint


def test_decode_produced_blocks_and_the_endpoint_are_inexact_and_an_exact_quote_stops_before_them():
    cache = checked_cache()
    history = tokens(PROMPT + 150)
    endpoint = serve(cache, history, 0, len(history), PROMPT, taps=[256])
    index = cache.index
    assert endpoint is not None and index.snapshots[endpoint].inexact
    marks = [node.inexact for node in sorted(index.nodes.values(), key=lambda n: n.depth) if node.parent]
    assert marks == [False] * 4 + [True] * 3  # block 4 holds positions 256..319: the prompt ends at 300
    follow_up = history + tokens(90, 1)
    assert cache.quote(exact(follow_up)).reuse_tokens == 256
    assert cache.quote(prompt(follow_up)).reuse_tokens == len(history)  # an inexact resume may start there


@pytest.mark.parametrize("host_write", [HostWrite.BACK, HostWrite.THROUGH])  # through: host copies too
def test_an_exact_prefill_replaces_the_inexact_blocks_copies_and_resumes_past_them(host_write):
    cache = checked_cache(host_write=host_write)
    history = tokens(PROMPT + 150)
    serve(cache, history, 0, len(history), PROMPT, taps=[256])
    index = cache.index
    inexact = {node.id: node.device_page for node in index.nodes.values() if node.inexact}
    through = host_write is HostWrite.THROUGH
    assert all((index.nodes[n].host_state == Residency.RESIDENT) == through for n in inexact)
    # the refill: an exact lane over the same tokens from 256, tapping the boundary below its end
    serve(cache, history, 1, len(history), len(history), taps=[448])
    for node_id, old_page in inexact.items():
        node = index.nodes[node_id]  # the same node, its copy replaced
        assert not node.inexact and node.device_state == Residency.RESIDENT
        assert node.device_page != old_page
    assert cache.quote(exact(history + tokens(90, 1))).reuse_tokens == 448


def test_an_exact_snapshot_takes_the_place_of_an_inexact_one_at_the_same_point():
    cache = checked_cache()
    history = tokens(256 + 129)  # computed 384: the decode endpoint sits on a block boundary
    first = serve(cache, history, 0, 384, 256)
    assert first is not None and cache.index.snapshots[first].kind.name == "ENDPOINT"
    serve(cache, history, 1, 384, 384)  # the exact lane's endpoint at the same point
    at_384 = [s for s in cache.index.snapshots.values() if s.frontier == 384]
    assert len(at_384) == 1 and not at_384[0].inexact and at_384[0].id != first
    assert cache.quote(exact(history + tokens(40, 2))).reuse_tokens == 384


def test_an_engine_that_resumes_only_exactly_keeps_no_inexact_endpoint():
    cache = checked_cache()
    history = tokens(PROMPT + 150)
    quoted = cache.quote(exact(history))
    cache.stage(quoted, 0)
    cache.activate(0)
    assert len(cache.block_table(0)) * BLOCK_TOKENS >= len(history)  # the output window covers it
    finished = cache.finish(0, history, exact_tokens=PROMPT, inexact_endpoint=False)
    assert finished.endpoint is None and finished.endpoint_skipped == "inexact (exact resumes only)"
    assert not cache.index.snapshots


def test_a_prefill_tap_inside_a_block_is_exact_and_the_lane_state_there_is_not():
    cache = checked_cache()
    toks = tokens(PROMPT)
    endpoint = serve(cache, toks, 0, PROMPT, PROMPT)  # the lane's plain state at 300, inside block 4
    assert endpoint is not None and cache.index.snapshots[endpoint].inexact
    follow_up = toks + tokens(50, 3)
    assert cache.quote(exact(follow_up)).reuse_tokens == 0  # blocks without an exact state resume nothing
    assert cache.quote(prompt(follow_up)).reuse_tokens == PROMPT  # an inexact resume would start there
    serve(cache, toks, 1, PROMPT, PROMPT, taps=[PROMPT - 1])  # captured inside the pass (a pending tail)
    tap = next(s for s in cache.index.snapshots.values() if s.frontier == PROMPT - 1)
    assert not tap.inexact
    assert cache.quote(exact(follow_up)).reuse_tokens == PROMPT - 1


def test_an_exact_only_cover_tells_a_router_only_what_an_exact_resume_uses():
    cache = checked_cache()
    history = tokens(PROMPT + 150)
    serve(cache, history, 0, len(history), PROMPT, taps=[256])
    exact_cover, inexact_cover = ResumableCover(exact_only=True), ResumableCover()
    blocks = {c.tier: len(c.blocks) for c in exact_cover.update(cache.index)}
    assert blocks == {Tier.DEVICE: 4, Tier.HOST: 4}  # up to the tap at 256, not the decode blocks below
    inexact_cover.update(cache.index)
    assert inexact_cover.num_covered(Tier.DEVICE) == 7  # an inexact resume uses the endpoint's path
    serve(cache, history, 1, len(history), len(history), taps=[len(history) - 1])  # the refill
    grown = exact_cover.update(cache.index)
    suffixes = sorted((c.tier, c.stored, len(c.blocks)) for c in grown)
    assert suffixes == [(Tier.DEVICE, True, 3), (Tier.HOST, True, 3)]  # the blocks the refill made exact
    fourth = next(c for c in exact_cover.covered() if c.tier == Tier.DEVICE).blocks[3]
    assert grown[0].blocks[0].parent_hash == fourth.lookup_hash  # hangs under what the router holds
    assert exact_cover.num_covered(Tier.DEVICE) == inexact_cover.num_covered(Tier.DEVICE) == 7
