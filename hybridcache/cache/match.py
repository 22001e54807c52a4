"""Admission arithmetic: lookup (§6.1), choice (§6.2) and capacity (§6.3). Pure: reads the index only.

``quote`` runs all three and returns a frozen ``Quote`` that carries the index's ``cache_epoch``, so a
stale quote is detectable before staging.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import TYPE_CHECKING, NamedTuple

import msgspec

from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.ids import BLOCK_TOKENS, NodeId, SnapshotId
from hybridcache.cache.records import BlockNode, LruList, Residency, Snapshot, pack_tokens

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


class Readiness(IntEnum):
    READY = 0
    TEMPORARILY_BLOCKED = 1
    PERMANENTLY_INFEASIBLE = 2


class SourceKind(IntEnum):
    ROOT = 0
    DEVICE = 1  # path, tail and image all on the device
    HOST = 2  # something restores from host slabs


class PromptInput(msgspec.Struct, frozen=True):
    """What admission needs of a prepared prompt. ``block_hashes`` covers every full block (§5.1).

    Mutating ``tokens`` after quoting is not supported; ``token_bytes`` (optional) must pack them.
    """

    tokens: Sequence[int]
    block_hashes: Sequence[int]
    extras: Sequence[int] | None = None  # media key per full block; None = all 0
    media_spans: Sequence[tuple[int, int]] = ()  # (begin, length) of Vision token spans
    output_tokens: int = 0  # bounded output window + per-lane cushion, in tokens
    enabled: bool = True  # False: no prefix reuse (warmup, --no-prefix-reuse)
    token_bytes: bytes | None = None  # optional: tokens packed as uint32 LE (records.pack_tokens); faster
    salt_key: int = 0  # the cache salt's extra key (0: none); a salted prompt never matches root snapshots
    # Resume only where a cold run's bits are reproduced: the walk stops at the first inexact block and
    # inexact snapshots are no candidates (records.BlockNode.inexact, Snapshot.inexact).
    exact_only: bool = False


class Match(NamedTuple):
    """The matched path (k full blocks) and the valid candidate snapshots on it, shallow first."""

    path: list[BlockNode]
    candidates: list[Snapshot]


class SourceOption(NamedTuple):
    snapshot: Snapshot | None
    frontier: int
    host_bytes: int
    seconds: float
    host_only_nodes: list[BlockNode]
    tail_restore: bool
    image_restore: bool
    need_pages: int
    pinned_evictable: int  # this admission's own LRU entries, not available to it


class Quote(msgspec.Struct, frozen=True):
    """The selected source, exact at ``cache_epoch``. ``reuse_tokens`` is the frontier resumed from."""

    readiness: Readiness
    source_kind: SourceKind
    snapshot: SnapshotId | None
    reuse_tokens: int
    cached_prefix_tokens: int
    fork_tokens: int  # the token where another cached sequence continues differently (fork_point), else 0
    path: tuple[NodeId, ...]  # nodes the lane maps (blocks below reuse_tokens)
    host_only_nodes: tuple[NodeId, ...]
    tail_restore: bool
    image_restore: bool
    restored_host_bytes: int
    need_pages: int
    private_pages: int
    prompt_tokens: int
    enabled: bool
    cache_epoch: int
    seq: int


def _frontier_in_media(frontier: int, spans: Sequence[tuple[int, int]]) -> bool:
    return any(begin < frontier < begin + length for begin, length in spans)


def match(index: PrefixIndex, prompt: PromptInput) -> Match:
    """§6.1: walk exact blocks below n-1, collect valid snapshots with F <= n-1 (with ``exact_only``, only
    up to the first inexact block, and no inexact snapshot). Pure (logically: a node
    reached for the first time fills its packed-token memo, ``BlockNode.packed_tokens``).

    The walk compares packed 256-byte blocks: ``prompt.token_bytes`` when given (it must pack exactly
    ``prompt.tokens``), else the matchable prefix packed here. Tokens and extra keys decide, never the hash.
    """
    tokens = prompt.tokens
    hashes, extras = prompt.block_hashes, prompt.extras
    n = len(tokens)
    limit = min(len(hashes), (n - 1) // BLOCK_TOKENS) if n > 0 else 0
    packed = prompt.token_bytes
    if packed is not None:
        if len(packed) != 4 * n:
            raise ValueError(f"token_bytes holds {len(packed)} bytes for {n} tokens")
    else:
        packed = pack_tokens(tokens[: limit * BLOCK_TOKENS])
    path = _walk_bytes(index.root, packed, hashes, extras, limit, prompt.exact_only)
    candidates: list[Snapshot] = []
    # A snapshot anchored at the root (frontier < 64) has no block whose extra key carries the cache
    # salt, so only unsalted prompts create (core/worker.py, _take_tap) or match one: tenants never
    # share a state below their first block.
    for anchor in path if prompt.salt_key else (index.root, *path):
        for snap in anchor.snapshots:
            frontier = snap.frontier
            if frontier > n - 1:
                continue
            tail = snap.tail_tokens
            if tail and tuple(tokens[frontier - len(tail) : frontier]) != tail:
                continue
            if prompt.media_spans and _frontier_in_media(frontier, prompt.media_spans):
                continue
            if snap.inexact and prompt.exact_only:
                continue
            candidates.append(snap)
    return Match(path, candidates)


def _walk_bytes(
    node: BlockNode,
    packed: bytes,
    hashes: Sequence[int],
    extras: Sequence[int] | None,
    limit: int,
    exact_only: bool = False,
) -> list[BlockNode]:
    """The exact walk, comparing 256-byte packed blocks (a bytes slice is one memcpy)."""
    path: list[BlockNode] = []
    start = 0
    width = 4 * BLOCK_TOKENS
    for block in range(limit):
        entry = node.children.get(hashes[block])
        if entry is None:
            break
        wanted = packed[start : start + width]
        extra = 0 if extras is None else extras[block]
        if entry.__class__ is list:  # lookup hashes collide: the children under it are listed
            for child in entry:
                child_bytes = child.token_bytes
                if child_bytes is None:  # a node no prompt has reached yet packs once
                    child_bytes = child.packed_tokens()
                if child_bytes == wanted and child.extra == extra:
                    break
            else:
                break
        else:  # a lone child, stored as itself: the common case
            child = entry
            child_bytes = child.token_bytes
            if child_bytes is None:
                child_bytes = child.packed_tokens()
            if child_bytes != wanted or child.extra != extra:
                break
        if exact_only and child.inexact:
            break
        node = child
        path.append(child)
        start += width
    return path


def fork_point(path: list[BlockNode], prompt: PromptInput) -> int:
    """The token where the prompt leaves a cached sequence that continues differently: the matched
    blocks plus the tokens of the next block the prompt shares with the closest child of the path's
    last node (exact: a capture can sit at any token); 0 when that node has no children. Pure.

    A sequence that leaves the tree inside a block shares that block's leading tokens with its sibling
    (sub-agents spawned from one context diverge wherever their task text starts), so flooring to the
    block would leave the next sibling to recompute up to 63 shared tokens."""
    if not path or not path[-1].children:
        return 0
    start = BLOCK_TOKENS * len(path)
    wanted = pack_tokens(prompt.tokens[start : start + BLOCK_TOKENS])
    shared = 0
    for entry in path[-1].children.values():
        for child in entry if entry.__class__ is list else (entry,):
            shared = max(shared, _common_prefix_bytes(child.packed_tokens(), wanted) // 4)
    return start + shared


def _common_prefix_bytes(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b``: a binary search over slice comparisons (each one
    memcmp), so a fork with many children costs a few compares per child. Pure."""
    low, high = 0, min(len(a), len(b))
    while low < high:
        mid = (low + high + 1) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid - 1
    return low


def private_pages_for(prompt_tokens: int, output_tokens: int, frontier: int) -> int:
    """Pages the lane owns privately: every block from floor(F/64) to the end of its entitlement."""
    total_blocks = -(-(prompt_tokens + output_tokens) // BLOCK_TOKENS)
    return max(total_blocks - frontier // BLOCK_TOKENS, 1)


def _option(
    index: PrefixIndex,
    path: list[BlockNode],
    snap: Snapshot | None,
    prompt: PromptInput,
    cost: CacheCostModel,
) -> SourceOption | None:
    """Cost and page need of resuming from ``snap`` (None = root); None when it is being filled."""
    geometry = index.geometry
    n = len(prompt.tokens)
    frontier = 0 if snap is None else snap.frontier
    mapped = path[: frontier // BLOCK_TOKENS]
    host_only: list[BlockNode] = []
    pinned_evictable = 0
    for node in mapped:
        if node.device_state == Residency.FILLING:
            return None
        if node.device_state == Residency.ABSENT:
            host_only.append(node)
        elif node.lru_list != LruList.NONE:
            pinned_evictable += 1
    tail_restore = image_restore = False
    if snap is not None:
        if snap.tail_device_state == Residency.FILLING:
            return None
        tail_restore = bool(snap.tail_tokens) and snap.tail_device_state == Residency.ABSENT
        image_restore = snap.device_state != Residency.RESIDENT
        if snap.lru_list != LruList.NONE:
            pinned_evictable += 1
    host_bytes = geometry.page_bytes * (len(host_only) + tail_restore) + geometry.image_bytes * image_restore
    seconds = cost.restore_seconds(host_bytes) + cost.prefill_seconds(frontier, n - frontier)
    private = private_pages_for(n, prompt.output_tokens, frontier)
    need = len(host_only) + tail_restore + private
    return SourceOption(
        snap, frontier, host_bytes, seconds, host_only, tail_restore, image_restore, need, pinned_evictable
    )


def source_options(
    index: PrefixIndex, found: Match, prompt: PromptInput, cost: CacheCostModel
) -> tuple[SourceOption, list[SourceOption]]:
    """§6.2: (cheapest option, fallback order [cheapest, s_dev, root] without repeats). Pure."""
    root = _option(index, found.path, None, prompt, cost)
    assert root is not None
    deepest_snap, device_snap = _deepest_candidates(found)
    deepest = None if deepest_snap is None else _option(index, found.path, deepest_snap, prompt, cost)
    device = None if device_snap is None else _option(index, found.path, device_snap, prompt, cost)
    options = [o for o in (root, deepest, device) if o is not None]
    best = min(options, key=lambda o: (o.seconds, o.host_bytes, -o.frontier))
    order = [best]
    for fallback in (device, root):
        if fallback is not None and all(fallback.snapshot is not o.snapshot for o in order):
            order.append(fallback)
    return best, order


def _deepest_candidates(found: Match) -> tuple[Snapshot | None, Snapshot | None]:
    """(deepest valid candidate, deepest valid candidate whose path, tail and image are all on the
    device), in one pass over the path: O(path + candidates). Pure."""
    filling_within: list[bool] = [False]  # [k]: a Filling node among the first k blocks
    host_only_within: list[int] = [0]  # [k]: host-only nodes among the first k blocks
    for node in found.path:
        filling_within.append(filling_within[-1] or node.device_state == Residency.FILLING)
        host_only_within.append(host_only_within[-1] + (node.device_state == Residency.ABSENT))
    deepest = device = None
    for snap in found.candidates:
        blocks = snap.frontier // BLOCK_TOKENS
        if filling_within[blocks] or snap.tail_device_state == Residency.FILLING:
            continue  # being filled: not a candidate now (§6.3)
        if deepest is None or snap.frontier > deepest.frontier:
            deepest = snap
        on_device = (
            host_only_within[blocks] == 0
            and snap.device_state == Residency.RESIDENT
            and not (snap.tail_tokens and snap.tail_device_state == Residency.ABSENT)
        )
        if on_device and (device is None or snap.frontier > device.frontier):
            device = snap
    return deepest, device


def fits(index: PrefixIndex, option: SourceOption) -> bool:
    """Whether ``option``'s pages fit now: free + evictable, less this admission's own LRU entries."""
    available = index.num_free_pages + index.num_evictable_pages - option.pinned_evictable
    return option.need_pages <= available


def quote(index: PrefixIndex, prompt: PromptInput, cost: CacheCostModel) -> Quote:
    """§6.1–§6.3 in one pure call: the source to stage, or why the request waits or cannot run."""
    if prompt.enabled:
        found = match(index, prompt)
    else:
        found = Match([], [])
    _best, order = source_options(index, found, prompt, cost)
    slot_free = index.slots.can_add_active() and index.slots.peek_free() is not None
    chosen = next((o for o in order if fits(index, o)), None) if slot_free else None
    if chosen is None:
        root = next(o for o in order if o.snapshot is None)
        infeasible = root.need_pages > index.geometry.num_pages
        readiness = Readiness.PERMANENTLY_INFEASIBLE if infeasible else Readiness.TEMPORARILY_BLOCKED
        chosen = root
    else:
        readiness = Readiness.READY
    snap = chosen.snapshot
    if snap is None:
        kind = SourceKind.ROOT
    else:
        kind = SourceKind.HOST if chosen.host_bytes else SourceKind.DEVICE
    return Quote(
        readiness=readiness,
        source_kind=kind,
        snapshot=None if snap is None else snap.id,
        reuse_tokens=chosen.frontier,
        cached_prefix_tokens=BLOCK_TOKENS * len(found.path),
        fork_tokens=fork_point(found.path, prompt),
        path=tuple(n.id for n in found.path[: chosen.frontier // BLOCK_TOKENS]),
        host_only_nodes=tuple(n.id for n in chosen.host_only_nodes),
        tail_restore=chosen.tail_restore,
        image_restore=chosen.image_restore,
        restored_host_bytes=chosen.host_bytes,
        need_pages=chosen.need_pages,
        private_pages=private_pages_for(len(prompt.tokens), prompt.output_tokens, chosen.frontier),
        prompt_tokens=len(prompt.tokens),
        enabled=prompt.enabled,
        cache_epoch=index.cache_epoch,
        seq=index.seq,
    )
