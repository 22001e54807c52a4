"""What a router is told a replica holds: the blocks up to each complete snapshot, per tier; a router
that applies the changes in order always holds exactly the cover recomputed from scratch."""

from __future__ import annotations

from cache_factories import checked_cache, geometry, run_request, tokens

from hybridcache.cache.events import SnapshotDeviceDropped
from hybridcache.cache.resumable_cover import CoverChange, ResumableCover, Tier
from hybridcache.cache.write_back import HostWrite


class RouterModel:
    """A router's view: the block hashes stored per tier, refusing a store whose parent it lacks."""

    def __init__(self) -> None:
        self.blocks: dict[Tier, set[int]] = {Tier.DEVICE: set(), Tier.HOST: set()}

    def apply(self, changes: list[CoverChange]) -> None:
        for change in changes:
            held = self.blocks[change.tier]
            hashes = [block.lookup_hash for block in change.blocks]
            if change.stored:
                parent = change.blocks[0].parent_hash
                assert parent is None or parent in held, "a stored suffix must hang under a held block"
                assert not held & set(hashes)
                held.update(hashes)
            else:
                assert set(hashes) <= held
                held.difference_update(hashes)


def fresh_cover(cache) -> dict[Tier, set[int]]:
    cover = ResumableCover()
    model = RouterModel()
    model.apply(cover.update(cache.index))
    return model.blocks


def path_hashes(cache, snapshot_id: int) -> list[int]:
    anchor = cache.index.snapshots[snapshot_id].anchor
    return [node.lookup_hash for node in cache.index.path_to(anchor)]


def test_an_endpoint_covers_its_full_blocks_on_both_tiers():
    cache = checked_cache(host_write=HostWrite.THROUGH)
    _, _, first = run_request(cache, tokens(300))
    changes = ResumableCover().update(cache.index)
    by_tier = {change.tier: change for change in changes}
    expected = path_hashes(cache, first.endpoint)
    assert len(expected) == 4  # 300 tokens: four full blocks, a 44-token tail
    for tier in (Tier.DEVICE, Tier.HOST):
        assert by_tier[tier].stored
        assert [block.lookup_hash for block in by_tier[tier].blocks] == expected
        assert by_tier[tier].blocks[0].parent_hash is None
        assert all(len(block.tokens) == 64 for block in by_tier[tier].blocks)


def test_blocks_without_a_snapshot_below_are_not_covered():
    cache = checked_cache()
    toks = tokens(300)
    run_request(cache, toks)
    cover = ResumableCover()
    cover.update(cache.index)
    blocks_in_tree = len(cache.index.nodes) - 1
    assert blocks_in_tree == 4 and cover.num_covered(Tier.DEVICE) == 4
    # A disabled request commits nothing; a longer conversation covers only up to its own endpoint.
    _, _, second = run_request(cache, [*toks, *tokens(200, 1)], lane=1)
    changes = cover.update(cache.index)
    assert [c.stored for c in changes if c.tier == Tier.DEVICE] == [True]
    suffix = next(c for c in changes if c.tier == Tier.DEVICE).blocks
    assert [b.lookup_hash for b in suffix] == path_hashes(cache, second.endpoint)[4:]
    assert suffix[0].parent_hash == path_hashes(cache, second.endpoint)[3]


def test_a_snapshot_leaving_the_device_uncovers_its_device_blocks_only():
    cache = checked_cache(host_write=HostWrite.THROUGH)
    _, _, first = run_request(cache, tokens(300))
    cover = ResumableCover()
    cover.update(cache.index)
    cache._apply(SnapshotDeviceDropped(0, first.endpoint))
    changes = cover.update(cache.index)
    assert [(c.tier, c.stored, len(c.blocks)) for c in changes] == [(Tier.DEVICE, False, 4)]
    assert cover.num_covered(Tier.HOST) == 4


def test_the_router_view_equals_the_recomputed_cover_through_evictions():
    """Many conversations through a small device and host: after every request, a router that applied
    every change holds exactly what a fresh cover of the index says, and `covered()` rebuilds it."""
    cache = checked_cache(geometry(num_pages=24, host_slabs=40, snapshot_slots=3))
    cover = ResumableCover()
    router = RouterModel()
    histories: list[list[int]] = [tokens(150 + 40 * k, seed=k) for k in range(5)]
    removals = 0
    for step in range(30):
        k = step % 5
        histories[k] = [*histories[k], *tokens(70, seed=100 + step)]
        run_request(cache, histories[k], lane=step % 2, generated=tokens(10, seed=200 + step))
        histories[k] = [*histories[k], *tokens(10, seed=200 + step)]
        changes = cover.update(cache.index)
        removals += sum(1 for change in changes if not change.stored)
        router.apply(changes)
        assert router.blocks == fresh_cover(cache), f"step {step}"
        rebuilt = RouterModel()
        rebuilt.apply(cover.covered())
        assert rebuilt.blocks == router.blocks
    assert router.blocks[Tier.DEVICE] and router.blocks[Tier.HOST]
    assert removals > 10  # the small tiers made the cover shrink as well as grow
