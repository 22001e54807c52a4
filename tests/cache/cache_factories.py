"""Factories and named assertion helpers for the cache tests.

``checked_cache`` wraps the index's ``apply`` so ``check_integrity`` runs after every single event.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import msgspec

from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.facade import Cache
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.hashing import block_hashes
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.match import PromptInput, Readiness
from hybridcache.cache.records import Residency
from hybridcache.cache.write_back import HostWrite

PAGE = 4096
IMAGE = 3 * PAGE  # an image spans three slabs


def geometry(
    num_pages: int = 64, host_slabs: int = 256, concurrency: int = 2, snapshot_slots: int = 3
) -> CacheGeometry:
    return CacheGeometry(
        num_pages=num_pages,
        page_bytes=PAGE,
        image_bytes=IMAGE,
        slab_bytes=PAGE,
        host_cache_bytes=host_slabs * PAGE,
        max_concurrency=concurrency,
        device_snapshot_slots=snapshot_slots,
        chunk_bytes=64 * PAGE,
    )


def checked_cache(
    geo: CacheGeometry | None = None,
    journal: list | None = None,
    cost: CacheCostModel | None = None,
    host_write: HostWrite = HostWrite.BACK,
    keep_backed_device_images: bool = True,
) -> Cache:
    """A Cache whose index checks its integrity after every applied event."""
    cache = Cache(
        geo or geometry(), cost or CacheCostModel.default(), journal, host_write,
        keep_backed_device_images=keep_backed_device_images,
    )
    index = cache.index
    apply = index.apply

    def apply_and_check(event):
        apply(event)
        check_integrity(index)

    index.apply = apply_and_check  # type: ignore[method-assign]
    return cache


def tokens(count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 50_000) for _ in range(count)]


def prompt(toks: Sequence[int], output_tokens: int = 64, enabled: bool = True, extras=None) -> PromptInput:
    return PromptInput(tuple(toks), block_hashes(toks, extras), extras, (), output_tokens, enabled)


def run_request(
    cache: Cache,
    toks: Sequence[int],
    lane: int = 0,
    generated: Sequence[int] = (),
    taps: Sequence[int] = (),
    land: bool = True,
    output_tokens: int = 64,
    hedges: Sequence[int] = (),
    boundaries: Sequence[int] = (),
):
    """Quote, stage, activate, prefill (taps at chunk boundaries), decode ``generated``, finish.

    ``hedges``: tap positions taken as hedges (cache/hedge_admission.py); ``boundaries``: as Boundaries.
    Lands every restore and write batch at once when ``land``. Returns (quote, staged, finish result).
    """
    quoted = cache.quote(prompt(toks, output_tokens))
    assert quoted.readiness == Readiness.READY, quoted
    staged = cache.stage(quoted, lane)
    cache.activate(lane)
    if land and staged.restore is not None:
        cache.restore_done(staged.restore.batch)
    writes = []
    for position in [*sorted({*taps, *hedges, *boundaries}), len(toks)]:  # chunk by chunk, tapping at ends
        if position < len(toks) and position > quoted.reuse_tokens:
            cache.take_tap(lane, position, boundary=position in boundaries, hedge=position in hedges)
        cache.commit_blocks(lane, toks[:position])
        published = cache.publish_ready_taps(lane, toks[:position])
        if published.write is not None:
            writes.append(published.write.batch)
    everything = list(toks) + list(generated)
    grow_to = -(-(len(everything)) // BLOCK_TOKENS)
    have = len(cache.block_table(lane))
    if grow_to > have:
        assert cache.allocate_growth_pages(lane, grow_to - have) is not None
    finished = cache.finish(lane, everything)
    if finished.write is not None:
        writes.append(finished.write.batch)
    if land:
        for batch in writes:
            cache.host_write_done(batch)
    return quoted, staged, finished


def flush_and_land(cache: Cache) -> int:
    """The engine's orderly stop before a save: write every reachable device-only block to the host and
    land the write. Returns the number of blocks written."""
    plan = cache.flush_to_host()
    if plan is None:
        return 0
    cache.host_write_done(plan.batch)
    return len(plan.blocks)


def assert_reuses(cache: Cache, toks: Sequence[int], expected_tokens: int) -> None:
    quoted = cache.quote(prompt(toks))
    assert quoted.reuse_tokens == expected_tokens, f"reuse {quoted.reuse_tokens}, expected {expected_tokens}"


def node_count(cache: Cache) -> int:
    return len(cache.index.nodes) - 1


def device_resident_nodes(cache: Cache) -> int:
    return sum(1 for n in cache.index.nodes.values() if n.parent and n.device_state == Residency.RESIDENT)


def insert_path(
    cache: Cache, toks: Sequence[int], lane: int = 9, extras=None, hashes=None, write: bool = True
) -> None:
    """Commit ``toks`` as tree blocks through a root-staged lane, then release it (no snapshots)."""
    quoted = msgspec.structs.replace(cache.quote(prompt(toks, 0, enabled=False)), enabled=True)
    cache.stage(quoted, lane)
    cache.activate(lane)
    cache.commit_blocks(lane, toks, hashes, extras)
    if write:
        result = cache.release(lane)
        if result.write is not None:
            cache.host_write_done(result.write.batch)
    else:
        from hybridcache.cache import events as ev

        cache._apply(ev.LaneReleased(0, lane))


def match_depth(cache: Cache, toks: Sequence[int], hashes=None, extras=None) -> int:
    """Blocks of ``toks`` the tree matches exactly."""
    from hybridcache.cache.match import PromptInput, match

    view = PromptInput(tuple(toks), hashes if hashes is not None else block_hashes(toks, extras), extras)
    return len(match(cache.index, view).path)


def linear_cost() -> CacheCostModel:
    """1 ms per prefilled token, nothing else: hand-computable GDSF values."""
    return CacheCostModel(
        token_seconds=1e-3,
        pair_seconds=0.0,
        chunk_seconds=0.0,
        prefill_chunk_tokens=2048,
        h2d_bytes_per_second=1e15,
        restore_batch_seconds=0.0,
    )
