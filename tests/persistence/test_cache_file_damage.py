"""A damaged prefix-cache file loads nothing and says why; a bad slab run drops exactly its entries."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from persistence_factories import (
    assert_host_only_and_intact,
    conversation_state,
    fingerprint,
    fresh_target,
    host_content,
    save,
    token_path,
)

from hybridcache.persistence.cache_file import PROLOGUE, SECTION, open_tables
from hybridcache.persistence.file_tree import FileTree
from hybridcache.persistence.load import LoadReport, load_prefix_cache


@pytest.fixture(scope="module")
def saved_file(tmp_path_factory: pytest.TempPathFactory):
    """One saved file (with its source state) shared by every damage case; cases damage copies."""
    state = conversation_state(seed=21)
    path = tmp_path_factory.mktemp("saved") / "cache.bin"
    save(path, state.cache, state.memory)
    return path, state


def damaged_copy(original: Path, directory: Path, edit) -> Path:
    copy = directory / f"damaged-{len(list(directory.iterdir()))}.bin"
    shutil.copyfile(original, copy)
    data = bytearray(copy.read_bytes())
    copy.write_bytes(bytes(edit(data)))
    return copy


def load_into_fresh(path: Path):
    target, memory = fresh_target()
    return load_prefix_cache(path, target, memory, fingerprint()), target, memory


def assert_loaded_nothing(report: LoadReport, target) -> None:
    assert report.status == "refused" and report.reason, report
    assert target.index.seq == 0 and len(target.index.nodes) == 1
    assert target.index.host.num_used == 0


def flip(offset: int):
    def edit(data: bytearray) -> bytearray:
        data[offset] ^= 0x5A
        return data

    return edit


def section_ranges(path: Path) -> dict[str, tuple[int, int]]:
    """Byte ranges (length field .. end of payload) of the three sections."""
    data = path.read_bytes()
    offset, ranges = PROLOGUE.size, {}
    for name in ("header", "blocks", "snapshots"):
        length, _ = SECTION.unpack_from(data, offset)
        ranges[name] = (offset, offset + SECTION.size + length)
        offset += SECTION.size + length
    return ranges


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 0.999999))
def test_truncation_anywhere_loads_nothing(saved_file, tmp_path: Path, cut: float):
    path, _ = saved_file
    size = path.stat().st_size
    copy = damaged_copy(path, tmp_path, lambda data: data[: int(size * cut)])
    report, target, _ = load_into_fresh(copy)
    assert_loaded_nothing(report, target)


@pytest.mark.parametrize("section", ["header", "blocks", "snapshots"])
@pytest.mark.parametrize("where", [0, 9, 17, -1])  # length, checksum, payload start, payload end
def test_a_flipped_byte_in_a_table_loads_nothing(saved_file, tmp_path: Path, section: str, where: int):
    path, _ = saved_file
    start, end = section_ranges(path)[section]
    offset = end - 1 if where == -1 else start + where
    report, target, _ = load_into_fresh(damaged_copy(path, tmp_path, flip(offset)))
    assert_loaded_nothing(report, target)
    assert "damaged" in report.reason


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0.0, 0.999999))
def test_any_flipped_byte_before_the_data_loads_nothing(saved_file, tmp_path: Path, position: float):
    path, _ = saved_file
    data_start = open_tables(path).data_start
    report, target, _ = load_into_fresh(damaged_copy(path, tmp_path, flip(int(data_start * position))))
    assert_loaded_nothing(report, target)


def test_a_flipped_reserved_prologue_byte_loads_nothing(saved_file, tmp_path: Path):
    path, _ = saved_file
    for offset in range(12, 16):  # the prologue's reserved u32, which no checksum covers
        report, target, _ = load_into_fresh(damaged_copy(path, tmp_path, flip(offset)))
        assert_loaded_nothing(report, target)
        assert "reserved" in report.reason


def test_wrong_magic_loads_nothing(saved_file, tmp_path: Path):
    path, _ = saved_file
    report, target, _ = load_into_fresh(damaged_copy(path, tmp_path, flip(0)))
    assert_loaded_nothing(report, target)
    assert "magic" in report.reason


def test_a_bad_block_run_drops_that_block_its_subtree_and_the_snapshots_below(saved_file, tmp_path: Path):
    path, state = saved_file
    tables = open_tables(path)
    tree = FileTree(tables)
    victim = next(b for b in tables.blocks if b.parent != 0 and len(tree.children[b.node]) <= 1)
    below = {s.snapshot for s in tables.snapshots if victim.node in tree.path(s.anchor)}
    offset = tables.data_start + victim.offset + 100
    report, target, memory = load_into_fresh(damaged_copy(path, tmp_path, flip(offset)))

    assert report.damaged_runs == 1 and report.restored_snapshots == len(tables.snapshots) - len(below)
    saved_blocks, saved_snaps = host_content(state.cache.index, state.memory)
    blocks, snaps = host_content(target.index, memory, saved_only=False)
    victim_path = tuple(tok for node in tree.path(victim.node) for tok in tree.blocks[node].tokens)
    assert victim_path not in blocks and victim_path in saved_blocks
    assert all(key[: len(victim_path)] != victim_path for key in blocks)
    assert {k: v for k, v in saved_snaps.items() if k[0][: len(victim_path)] != victim_path} == snaps
    needed = {token_path(n) for s in target.index.snapshots.values() for n in target.index.path_to(s.anchor)}
    assert set(blocks) == needed and all(blocks[k] == saved_blocks[k] for k in blocks)
    assert_host_only_and_intact(target)


def test_a_bad_snapshot_run_drops_only_that_snapshot_and_the_path_no_one_else_needs(
    saved_file, tmp_path: Path
):
    path, state = saved_file
    tables = open_tables(path)
    victim = tables.snapshots[-1]
    report, target, memory = load_into_fresh(
        damaged_copy(path, tmp_path, flip(tables.data_start + victim.offset + 4096 + 7))
    )

    assert report.damaged_runs == 1 and report.status == "partial"
    _, saved_snaps = host_content(state.cache.index, state.memory)
    blocks, snaps = host_content(target.index, memory, saved_only=False)
    assert len(snaps) == len(saved_snaps) - 1 and all(saved_snaps[k] == v for k, v in snaps.items())
    needed = {token_path(n) for s in target.index.snapshots.values() for n in target.index.path_to(s.anchor)}
    assert set(blocks) == needed
    assert_host_only_and_intact(target)
