"""Factories and named assertions for the persistence tests: cache states with real slab bytes.

A state is built by driving ``Cache`` like the engine does (``cache_factories.run_request``); every owned
host slab then gets seeded random bytes, so a save/load round trip can be compared byte for byte.
Entries are compared by content (token paths, tails), never by id: a load assigns fresh ids.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import NamedTuple

import numpy as np
from cache_factories import checked_cache, flush_and_land, geometry, run_request, tokens

from hybridcache.cache.facade import Cache
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.records import BlockNode
from hybridcache.gpu.host_tier import HostSlabMemory
from hybridcache.persistence.fingerprint import CacheFingerprint
from hybridcache.persistence.save import save_prefix_cache, select_saved

SYSTEM_PROMPT = tokens(150, seed=1)


def fingerprint(**changes: object) -> CacheFingerprint:
    fields: dict[str, object] = {
        "checkpoint_path": "/models/qwen3.5-test",
        "checkpoint_bytes": 123_456,
        "checkpoint_mtime_ns": 1_700_000_000_000_000_000,
        "model_config_hash": "c0ffee",
        "dtype": "bfloat16",
        "kv_layout": "paged-64",
        "rope": '{"theta":10000}',
        "prefill_signature": "chunk-2048",
        "program_version": "0.1.0",
        "build_id": "b1",
    }
    fields.update(changes)
    return CacheFingerprint(**fields)  # type: ignore[arg-type]


def fill_slabs(cache: Cache, memory: HostSlabMemory, seed: int = 7) -> None:
    """Seeded random bytes in every owned host slab (the engine's write-through stands in)."""
    rng = np.random.default_rng(seed)
    for slab in sorted(cache.index.slab_owners):
        view = memory.slab_view(slab).numpy()
        view[:] = rng.integers(0, 256, size=view.size, dtype=np.uint8)


class State(NamedTuple):
    cache: Cache
    memory: HostSlabMemory
    next_prompts: list[list[int]]  # each conversation's next prompt (its history plus a new message)


def conversation_state(seed: int = 0, turns: int = 3, conversations: int = 3, host_slabs: int = 256) -> State:
    """Several conversations sharing a system prompt, each continued for ``turns`` turns with taps,
    every host write landed, then the engine's stop-time flush of reachable device-only blocks (what a
    save follows), and every owned slab filled with seeded bytes."""
    rng = random.Random(seed)
    cache = checked_cache(geometry(num_pages=96, host_slabs=host_slabs, concurrency=2, snapshot_slots=3))
    memory = HostSlabMemory(cache.index.host)  # type: ignore[arg-type]
    next_prompts = []
    for conversation in range(conversations):
        history = SYSTEM_PROMPT + tokens(rng.randrange(40, 120), seed=100 * seed + conversation)
        for turn in range(turns):
            reply = tokens(rng.randrange(10, 90), seed=1000 * seed + 10 * conversation + turn)
            run_request(cache, history, generated=reply, taps=[128] if len(history) > 140 else [])
            history = history + reply + tokens(rng.randrange(5, 70), seed=7 * turn + conversation + 3)
        next_prompts.append(history)
    flush_and_land(cache)
    fill_slabs(cache, memory, seed)
    return State(cache, memory, next_prompts)


def fresh_target(host_slabs: int = 256) -> tuple[Cache, HostSlabMemory]:
    cache = checked_cache(geometry(num_pages=96, host_slabs=host_slabs, concurrency=2, snapshot_slots=3))
    return cache, HostSlabMemory(cache.index.host)  # type: ignore[arg-type]


def save(path: Path, cache: Cache, memory: HostSlabMemory, **kwargs):
    return save_prefix_cache(path, cache.index, memory, fingerprint(), **kwargs)


# ---------------------------------------------------------------------- content views
def token_path(node: BlockNode) -> tuple[int, ...]:
    out: list[int] = []
    while node.parent is not None:
        out[:0] = node.tokens
        node = node.parent
    return tuple(out)


def _slab_bytes(memory: HostSlabMemory, slabs) -> bytes:
    return b"".join(memory.slab_view(slab).numpy().tobytes() for slab in slabs)


def host_content(index: PrefixIndex, memory: HostSlabMemory, saved_only: bool = True):
    """(blocks, snapshots): token path -> slab bytes; (anchor path, tail) -> (kind, hits, superseded,
    bytes)."""
    if saved_only:
        nodes, snaps = select_saved(index)
    else:
        nodes = [n for n in index.nodes.values() if n.parent is not None]
        snaps = list(index.snapshots.values())
    blocks = {token_path(n): _slab_bytes(memory, [n.host_slab]) for n in nodes}
    snapshots = {}
    for snap in snaps:
        tail = [] if snap.tail_host_slab is None else [snap.tail_host_slab]
        key = (token_path(snap.anchor), snap.tail_tokens)
        snapshots[key] = (
            int(snap.kind), snap.hits, snap.superseded, _slab_bytes(memory, [*snap.host_slabs, *tail])
        )
    return blocks, snapshots


def assert_host_only_and_intact(cache: Cache) -> None:
    """Every entry is host-only, no lane or transfer exists, and the invariants hold."""
    index = cache.index
    check_integrity(index)
    assert not index.lanes and not index.restores and not index.host_writes
    for node in index.nodes.values():
        if node.parent is not None:
            assert node.device_page is None and node.host_slab is not None
    for snap in index.snapshots.values():
        assert snap.device_slot is None and snap.host_complete
