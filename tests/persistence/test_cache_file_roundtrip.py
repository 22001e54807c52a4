"""Save → load: the prefix-cache file restores exactly the saved entries, host-only, byte for byte."""

from __future__ import annotations

import stat
from pathlib import Path

import msgspec
from cache_factories import (
    assert_reuses,
    checked_cache,
    flush_and_land,
    geometry,
    prompt,
    run_request,
    tokens,
)
from persistence_factories import (
    assert_host_only_and_intact,
    conversation_state,
    fingerprint,
    fresh_target,
    host_content,
    save,
)

from hybridcache.cache import events as ev
from hybridcache.cache.records import Residency
from hybridcache.gpu.host_tier import HostSlabMemory
from hybridcache.persistence.cache_file import open_tables
from hybridcache.persistence.load import load_prefix_cache
from hybridcache.persistence.save import select_saved


def test_a_saved_cache_loads_into_a_fresh_index_with_the_same_entries_and_bytes(tmp_path: Path):
    state = conversation_state(seed=1)
    report = save(tmp_path / "cache.bin", state.cache, state.memory)
    target, memory = fresh_target()

    loaded = load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint())

    assert report.saved and loaded.status == "restored", loaded.message
    assert (loaded.restored_snapshots, loaded.restored_blocks) == (report.snapshots, report.blocks)
    assert host_content(target.index, memory, saved_only=False) == host_content(
        state.cache.index, state.memory
    )
    assert_host_only_and_intact(target)


def test_the_first_request_after_a_restart_reuses_the_same_prefix(tmp_path: Path):
    state = conversation_state(seed=2)
    before = [state.cache.quote(prompt(p)).reuse_tokens for p in state.next_prompts]
    save(tmp_path / "cache.bin", state.cache, state.memory)
    target, memory = fresh_target()
    load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint())

    for next_prompt, reuse in zip(state.next_prompts, before):
        assert reuse > 0
        assert_reuses(target, next_prompt, reuse)
    _, staged, _ = run_request(target, state.next_prompts[0])  # restores through the host path
    assert staged.reuse_tokens == before[0] and staged.restore is not None


def test_the_file_is_private_and_replaces_the_previous_one(tmp_path: Path):
    path = tmp_path / "cache.bin"
    path.write_bytes(b"old")
    state = conversation_state(seed=3)
    save(path, state.cache, state.memory)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes()[:8] == b"HCPREFIX"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.bin"]


def test_dead_kv_and_device_only_content_are_not_saved_but_superseded_snapshots_are(tmp_path: Path):
    state = conversation_state(seed=4)
    cache = state.cache
    _, _, gone = run_request(cache, tokens(200, seed=77))
    flush_and_land(cache)
    cache._apply(ev.SnapshotDeleted(0, gone.endpoint))  # its host-resident path is left as dead KV
    run_request(cache, tokens(300, seed=78), lane=1, land=False)  # the endpoint's copies in flight
    index = cache.index
    superseded = [s for s in index.snapshots.values() if s.superseded]
    filling = [s for s in index.snapshots.values() if s.host_state != Residency.RESIDENT]
    assert superseded and filling and index.dead_nodes

    blocks, snapshots = select_saved(index)
    save(tmp_path / "cache.bin", cache, state.memory)
    tables = open_tables(tmp_path / "cache.bin")

    saved_ids = {s.snapshot for s in tables.snapshots}
    assert saved_ids == {s.id for s in snapshots}
    assert not saved_ids & {s.id for s in filling}
    saved_superseded = {s.id for s in superseded if s.host_complete}
    assert saved_superseded and saved_superseded <= saved_ids
    assert {r.snapshot for r in tables.snapshots if r.superseded} == saved_superseded
    assert not {b.node for b in tables.blocks} & set(index.dead_nodes)
    paths = {n.id for s in snapshots for n in index.path_to(s.anchor)}
    assert {b.node for b in tables.blocks} == paths == {n.id for n in blocks}


def test_superseded_snapshots_come_back_superseded(tmp_path: Path):
    state = conversation_state(seed=6)
    index = state.cache.index
    assert any(s.superseded for s in index.snapshots.values())
    save(tmp_path / "cache.bin", state.cache, state.memory)
    target, memory = fresh_target()
    loaded = load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint())
    assert loaded.status == "restored", loaded.message
    assert host_content(target.index, memory) == host_content(index, state.memory)  # flags included
    saved_superseded = sum(s.superseded for s in select_saved(index)[1])
    assert saved_superseded > 0
    assert sum(s.superseded for s in target.index.snapshots.values()) == saved_superseded
    assert_host_only_and_intact(target)


def test_an_empty_cache_saves_an_empty_file_that_loads_nothing(tmp_path: Path):
    empty, memory = fresh_target()
    report = save(tmp_path / "cache.bin", empty, memory)
    target, target_memory = fresh_target()
    loaded = load_prefix_cache(tmp_path / "cache.bin", target, target_memory, fingerprint())
    assert report.saved and report.snapshots == 0
    assert loaded.status == "none" and loaded.reason == "the file holds no snapshots"
    assert len(target.index.nodes) == 1


def test_a_missing_file_is_reported_as_absent(tmp_path: Path):
    target, memory = fresh_target()
    loaded = load_prefix_cache(tmp_path / "none.bin", target, memory, fingerprint())
    assert loaded.status == "absent" and target.index.seq == 0


def test_a_file_from_another_fingerprint_is_refused(tmp_path: Path):
    state = conversation_state(seed=5)
    save(tmp_path / "cache.bin", state.cache, state.memory)
    for field, value in (("checkpoint_mtime_ns", 1), ("build_id", "b2"), ("dtype", "float16")):
        target, memory = fresh_target()
        loaded = load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint(**{field: value}))
        assert loaded.status == "refused" and field in loaded.reason
        assert target.index.seq == 0


def test_a_file_from_another_host_geometry_is_refused(tmp_path: Path):
    state = conversation_state(seed=6)
    save(tmp_path / "cache.bin", state.cache, state.memory)
    other = geometry(num_pages=96, host_slabs=256)
    other = msgspec.structs.replace(other, image_bytes=other.image_bytes + 4096)
    target = checked_cache(other)
    loaded = load_prefix_cache(
        tmp_path / "cache.bin",
        target,
        HostSlabMemory(target.index.host),
        fingerprint(),  # type: ignore[arg-type]
    )
    assert loaded.status == "refused" and "geometry" in loaded.reason
    assert target.index.seq == 0


def test_a_load_into_an_index_that_already_holds_entries_is_refused(tmp_path: Path):
    state = conversation_state(seed=7)
    save(tmp_path / "cache.bin", state.cache, state.memory)
    target, memory = fresh_target()
    run_request(target, tokens(200, seed=5))
    seq = target.index.seq
    loaded = load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint())
    assert loaded.status == "refused" and target.index.seq == seq


def test_loaded_entries_arrive_as_journaled_events_parents_first(tmp_path: Path):
    state = conversation_state(seed=8)
    save(tmp_path / "cache.bin", state.cache, state.memory)
    target, memory = fresh_target()
    target.journal = []
    load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint())

    kinds = [type(e) for e in target.journal]
    assert kinds.count(ev.BlockLoaded) == len(target.index.nodes) - 1
    assert kinds.count(ev.SnapshotLoaded) == len(target.index.snapshots)
    assert kinds.index(ev.SnapshotLoaded) > max(i for i, k in enumerate(kinds) if k is ev.BlockLoaded)
    seen = {0}
    for event in target.journal:
        if isinstance(event, ev.BlockLoaded):
            assert event.parent in seen
            seen.add(event.node)
    assert [e.seq for e in target.journal] == list(range(1, target.index.seq + 1))


def test_progress_reports_every_byte_of_the_save_and_the_read(tmp_path: Path):
    state = conversation_state(seed=9)
    written: list[int] = []
    report = save(tmp_path / "cache.bin", state.cache, state.memory, progress=written.append)
    target, memory = fresh_target()
    read: list[int] = []
    loaded = load_prefix_cache(tmp_path / "cache.bin", target, memory, fingerprint(), progress=read.append)

    assert (
        written == sorted(written)
        and written[-1] == report.file_bytes == (tmp_path / "cache.bin").stat().st_size
    )
    tables = open_tables(tmp_path / "cache.bin")
    assert read == sorted(read) and read[-1] == loaded.bytes_read == tables.header.data_bytes
    assert loaded.seconds > 0 and "MiB/s" in loaded.message and "MiB/s" in report.message
