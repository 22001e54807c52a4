"""plan_host_restore: whole files restore whole; a small tier keeps the densest snapshots and only their
paths (spec §5.5). Tested on hand-built tables (pure) and through a real partial load."""

from __future__ import annotations

from pathlib import Path

from cache_factories import linear_cost
from hypothesis import given, settings
from hypothesis import strategies as st
from persistence_factories import (
    assert_host_only_and_intact,
    conversation_state,
    fingerprint,
    fresh_target,
    save,
)

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.persistence.cache_file import (
    FORMAT_VERSION,
    BlockRecord,
    CacheFileHeader,
    CacheFileTables,
    FileGeometry,
    SnapshotRecord,
    open_tables,
)
from hybridcache.persistence.file_tree import FileTree
from hybridcache.persistence.load import load_prefix_cache
from hybridcache.persistence.restore_plan import plan_host_restore, snapshot_density

SLAB = 4096
IMAGE_SLABS = 3


def file_tables(parents: list[int], snapshots: list[tuple[int, int, int]]) -> CacheFileTables:
    """Tables for blocks 1..n (``parents[i]`` is block i+1's parent) and snapshots (anchor, tail, hits)."""
    blocks = [
        BlockRecord(i + 1, parent, i, (i,) * BLOCK_TOKENS, 0, i * SLAB, 0) for i, parent in enumerate(parents)
    ]
    offset = len(blocks) * SLAB
    records = []
    for number, (anchor, tail, hits) in enumerate(snapshots):
        records.append(SnapshotRecord(number, anchor, 1, (number,) * tail, hits, 0.0, offset, 0))
        offset += (IMAGE_SLABS + (1 if tail else 0)) * SLAB
    header = CacheFileHeader(
        format_version=FORMAT_VERSION,
        fingerprint=fingerprint(),
        geometry=FileGeometry(SLAB, IMAGE_SLABS * SLAB, IMAGE_SLABS),
        blocks=len(blocks),
        snapshots=len(records),
        data_bytes=offset,
    )
    return CacheFileTables(header, blocks, records, SLAB, SLAB + offset)


def needed_alone(tables: CacheFileTables, snap: SnapshotRecord) -> int:
    return len(FileTree(tables).path(snap.anchor)) + tables.snapshot_slabs(snap)


def test_a_tier_that_holds_the_whole_file_restores_everything():
    tables = file_tables([0, 1, 2, 1], [(3, 5, 0), (4, 0, 2), (0, 9, 0)])
    plan = plan_host_restore(tables, tables.total_slabs, linear_cost())
    assert plan.whole and plan.snapshots == (0, 1, 2) and plan.blocks == (1, 2, 3, 4)


def test_a_small_tier_keeps_the_densest_snapshot_and_only_its_path():
    # Two conversations off block 1: a long one (blocks 2..5) never hit, a short one (block 6) hit 5 times.
    tables = file_tables([0, 1, 2, 3, 4, 1], [(5, 0, 0), (6, 0, 5)])
    tree = FileTree(tables)
    long_snap, short_snap = tables.snapshots
    assert snapshot_density(tree, short_snap, linear_cost()) > snapshot_density(
        tree, long_snap, linear_cost()
    )

    plan = plan_host_restore(tables, needed_alone(tables, long_snap), linear_cost())

    assert plan.snapshots == (1,) and plan.blocks == (1, 6)
    assert not plan.whole and plan.file_slabs == tables.total_slabs


def test_a_tier_too_small_for_any_snapshot_restores_nothing():
    tables = file_tables([0, 1], [(2, 0, 0)])
    plan = plan_host_restore(tables, IMAGE_SLABS + 1, linear_cost())
    assert plan.snapshots == () and plan.blocks == () and plan.slabs == 0


@st.composite
def trees_with_snapshots(draw):
    count = draw(st.integers(1, 14))
    parents = [draw(st.integers(0, i)) for i in range(count)]
    snaps = draw(
        st.lists(st.tuples(st.integers(0, count), st.integers(0, 63), st.integers(0, 6)), max_size=8)
    )
    unique = list({(anchor, tail): (anchor, tail, hits) for anchor, tail, hits in snaps}.values())
    return file_tables(parents, unique), draw(st.integers(0, 60))


@settings(max_examples=120, deadline=None)
@given(trees_with_snapshots())
def test_a_plan_fits_takes_exactly_its_paths_parents_first_and_is_greedy(case):
    tables, free = case
    plan = plan_host_restore(tables, free, linear_cost())
    tree = FileTree(tables)
    chosen = [s for s in tables.snapshots if s.snapshot in plan.snapshots]
    if plan.whole:
        assert plan.slabs <= free and len(plan.snapshots) == len(tables.snapshots)
        return
    paths = {node for snap in chosen for node in tree.path(snap.anchor)}
    assert set(plan.blocks) == paths and len(plan.blocks) == len(paths)
    assert plan.slabs == len(paths) + sum(tables.snapshot_slabs(s) for s in chosen) <= free
    table_order = [b.node for b in tables.blocks if b.node in paths]
    assert list(plan.blocks) == table_order  # parents before children
    left = free - plan.slabs
    for snap in tables.snapshots:
        if snap.snapshot not in plan.snapshots:
            extra = [n for n in tree.path(snap.anchor) if n not in paths]
            assert len(extra) + tables.snapshot_slabs(snap) > left  # greedy: nothing else fits
    if tables.snapshots:
        densest = min(
            tables.snapshots,
            key=lambda s: (-snapshot_density(tree, s, linear_cost()), tables.snapshots.index(s)),
        )
        assert (densest.snapshot in plan.snapshots) == (needed_alone(tables, densest) <= free)


def test_a_partial_load_restores_the_planned_snapshots_with_exactly_their_paths(tmp_path: Path):
    state = conversation_state(seed=11)
    save(tmp_path / "cache.bin", state.cache, state.memory)
    tables = open_tables(tmp_path / "cache.bin")
    small = tables.total_slabs - 2
    target, memory = fresh_target(host_slabs=small)
    plan = plan_host_restore(tables, small, target.cost)

    loaded = load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint())

    assert loaded.status == "partial", loaded.message
    assert loaded.restored_snapshots == len(plan.snapshots) < len(tables.snapshots)
    assert loaded.restored_blocks == len(plan.blocks) == len(target.index.nodes) - 1
    assert loaded.file_host_bytes == tables.total_slabs * SLAB
    assert loaded.bytes_read == plan.slabs * SLAB < tables.header.data_bytes  # only the chosen slabs
    assert "partly restored" in loaded.message
    saved_frontiers = sorted(
        FileTree(tables).frontier(s) for s in tables.snapshots if s.snapshot in plan.snapshots
    )
    assert sorted(s.frontier for s in target.index.snapshots.values()) == saved_frontiers
    assert_host_only_and_intact(target)


def test_a_tier_too_small_for_any_snapshot_loads_nothing_and_names_the_tier_needed(tmp_path: Path):
    state = conversation_state(seed=12)
    save(tmp_path / "cache.bin", state.cache, state.memory)
    target, memory = fresh_target(host_slabs=IMAGE_SLABS)
    loaded = load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint())
    assert loaded.status == "none" and "holds none of the snapshots" in loaded.reason
    assert f"{loaded.file_host_bytes / 2**20:.1f} MiB" in loaded.message and target.index.seq == 0
