"""The cache directory's contents journal: folding, torn tails, compaction, the writer thread."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.persistence.contents_file import (
    ContentsFileError,
    encode_records,
    read_contents,
    temporary_name,
    write_contents_file,
)
from hybridcache.persistence.contents_fold import ContentsFold
from hybridcache.persistence.contents_records import (
    BlockReleased,
    BlockStored,
    ContentsGeometry,
    ContentsHeader,
    ImageStored,
    NodeRemoved,
    SnapshotRemoved,
    SnapshotState,
    TailStored,
)
from hybridcache.persistence.contents_writer import ContentsWriter, PendingStore
from hybridcache.persistence.fingerprint import CacheFingerprint

FINGERPRINT = CacheFingerprint(
    checkpoint_path="/m", checkpoint_bytes=1, checkpoint_mtime_ns=1, model_config_hash="c", dtype="f32",
    kv_layout="k", rope="r", prefill_signature="p", program_version="0", build_id="b",
)
HEADER = ContentsHeader(format_version=1, fingerprint=FINGERPRINT, geometry=ContentsGeometry(64, 128, 2))


def block(node: int, parent: int, slab: int, checksum: int = 7) -> BlockStored:
    return BlockStored(node, parent, node * 11, tuple(range(64)), 0, slab, checksum)


def image(snapshot: int, anchor: int, slabs: tuple[int, ...], tail: tuple[int, ...] = ()) -> ImageStored:
    return ImageStored(snapshot, anchor, 0, tail, slabs, 9)


def state(fold: ContentsFold):
    return fold.blocks, fold.images, fold.tails, fold.restorable()


def test_removing_a_node_removes_its_subtree_and_the_snapshots_anchored_there():
    fold = ContentsFold()
    for record in (block(1, 0, 0), block(2, 1, 1), block(3, 2, 2), block(4, 0, 3),
                   image(10, 2, (4, 5), (1,)), TailStored(10, 6, 3), image(11, 4, (7, 8))):
        fold.apply(record)
    fold.apply(NodeRemoved(1))
    assert set(fold.blocks) == {4} and set(fold.images) == {11} and not fold.tails


def test_a_released_block_hides_its_stored_children_until_it_is_stored_again():
    fold = ContentsFold()
    for record in (block(1, 0, 0), block(2, 1, 1), image(10, 2, (4, 5))):
        fold.apply(record)
    fold.apply(BlockReleased(1))
    entries = fold.restorable()
    assert entries.blocks == [] and entries.snapshots == []  # node 2 is unreachable, so is snapshot 10
    fold.apply(block(1, 0, 9))
    entries = fold.restorable()
    assert [b.node for b in entries.blocks] == [1, 2] and len(entries.snapshots) == 1


def test_a_snapshot_with_tail_tokens_needs_its_tail_and_state_records_change_hits():
    fold = ContentsFold()
    fold.apply(image(10, 0, (1, 2), tail=(5, 6)))
    assert fold.restorable().snapshots == []
    fold.apply(TailStored(10, 3, 4))
    fold.apply(SnapshotState(10, hits=3, superseded=True))
    ((restored, tail),) = fold.restorable().snapshots
    assert restored.hits == 3 and restored.superseded and tail == TailStored(10, 3, 4)
    fold.apply(SnapshotRemoved(10))
    assert fold.restorable().snapshots == []


_records = st.lists(
    st.one_of(
        st.builds(block, st.integers(1, 12), st.integers(0, 12), st.integers(0, 40)),
        st.builds(image, st.integers(20, 26), st.integers(0, 12), st.tuples(st.integers(0, 40))),
        st.builds(TailStored, st.integers(20, 26), st.integers(0, 40), st.integers(0, 5)),
        st.builds(SnapshotState, st.integers(20, 26), st.integers(0, 5), st.booleans()),
        st.builds(BlockReleased, st.integers(1, 12)),
        st.builds(NodeRemoved, st.integers(1, 12)),
        st.builds(SnapshotRemoved, st.integers(20, 26)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(_records, _records)
def test_a_compacted_base_folds_to_the_same_state_and_keeps_folding_the_same(history, later):
    """Compaction round trip: the base table of a fold, folded afresh, equals the fold, and so do both
    after the same later records (which may name entries only the old tail mentioned)."""
    original = ContentsFold()
    for record in history:
        original.apply(record)
    compacted = ContentsFold()
    for record in original.base_records():
        compacted.apply(record)
    assert state(compacted) == state(original)
    for record in later:
        original.apply(record)
        compacted.apply(record)
    assert state(compacted) == state(original)


def test_a_torn_or_corrupt_tail_is_dropped_and_what_precedes_it_folds(tmp_path: Path):
    path = tmp_path / "contents"
    write_contents_file(path, HEADER, [block(1, 0, 0), image(10, 1, (1, 2))])
    good = path.stat().st_size
    with open(path, "ab") as stream:
        stream.write(encode_records([block(2, 1, 3)]))
        stream.write(encode_records([block(3, 2, 4)])[:-5])  # a crash mid-write
    read = read_contents(path)
    assert set(read.fold.blocks) == {1, 2} and read.damage is not None
    assert read.dropped_bytes == path.stat().st_size - good - len(encode_records([block(2, 1, 3)]))
    data = bytearray(path.read_bytes())
    data[good + 10] ^= 0xFF  # corrupt the first tail frame: everything after it is dropped
    path.write_bytes(bytes(data))
    read = read_contents(path)
    assert set(read.fold.blocks) == {1} and read.damage.reason == "frame checksum mismatch"


def test_a_file_that_is_not_a_contents_file_is_refused(tmp_path: Path):
    path = tmp_path / "contents"
    path.write_bytes(b"not a contents file")
    with pytest.raises(ContentsFileError):
        read_contents(path)


def test_a_rewrite_is_atomic_private_and_leaves_no_temporary_file(tmp_path: Path):
    old_umask = os.umask(0)
    try:
        path = tmp_path / "contents"
        write_contents_file(path, HEADER, [block(1, 0, 0)])
        seen = []
        write_contents_file(path, HEADER, [block(2, 0, 1)],
                            before_rename=lambda: seen.append(temporary_name(path).stat().st_mode))
    finally:
        os.umask(old_umask)
    assert seen[0] & 0o777 == 0o600 and path.stat().st_mode & 0o777 == 0o600
    assert not temporary_name(path).exists() and set(read_contents(path).fold.blocks) == {2}


class _Slabs:
    """Slab bytes in memory with the generations a sink would keep."""

    def __init__(self, count: int = 8, size: int = 64) -> None:
        self.memory = np.zeros((count, size), dtype=np.uint8)
        self.generations = [0] * count
        self.syncs = 0

    def read(self, slab: int):
        return self.memory[slab].tobytes()

    def sync(self) -> None:
        self.syncs += 1


def _writer(path: Path, slabs: _Slabs, **kwargs) -> ContentsWriter:
    write_contents_file(path, HEADER, [])
    return ContentsWriter(path, HEADER, ContentsFold(), slabs.read, slabs.generations.__getitem__, slabs.sync,
                          flush_interval_s=0.001, **kwargs)


def test_stores_are_hashed_synced_and_written_then_compacted_into_a_short_file(tmp_path: Path):
    slabs = _Slabs()
    path = tmp_path / "contents"
    writer = _writer(path, slabs, compact_min_tail=4, compact_tail_ratio=1.0)
    try:
        for node in range(1, 7):
            slabs.memory[node] = node
            writer.append([PendingStore(block(node, node - 1, node, 0), (node,), (0,))])
            writer.append([SnapshotState(99, node, False)])  # names nothing: folds to nothing
            assert writer.flush(30.0)
        assert writer.compactions >= 1 and slabs.syncs >= 6
    finally:
        writer.close()
    read = read_contents(path)
    assert read.base_entries + read.tail_records <= 6 + max(4, 6) + 2
    assert {n: b.checksum for n, b in read.fold.blocks.items()} == {
        n: xxhash.xxh3_64_intdigest(bytes([n]) * 64) for n in range(1, 7)
    }


def test_a_store_whose_slab_was_reused_before_it_was_hashed_is_not_recorded(tmp_path: Path):
    slabs = _Slabs()
    path = tmp_path / "contents"
    writer = _writer(path, slabs)
    try:
        slabs.generations[3] = 2  # the worker reused slab 3 after the store saw generation 1
        writer.append([PendingStore(block(1, 0, 3, 0), (3,), (1,))])
        assert writer.flush(30.0)
        assert writer.stores_skipped == 1
    finally:
        writer.close()
    assert read_contents(path).fold.blocks == {}


def test_a_write_error_stops_the_writer_and_is_reported(tmp_path: Path):
    slabs = _Slabs()
    path = tmp_path / "contents"

    def failing_sync() -> None:
        raise OSError(28, "No space left on device")

    writer = _writer(path, slabs)
    writer._sync_slabs = failing_sync
    try:
        writer.append([PendingStore(block(1, 0, 1, 0), (1,), (0,))])
        assert writer.flush(30.0) is False
        assert isinstance(writer.error, OSError)
    finally:
        writer.close()
    assert read_contents(path).fold.blocks == {}
