"""Records held by the prefix index: block nodes, snapshots, lanes, and their enums (spec §5.2, §5.3).

Records are plain ``__slots__`` classes mutated only by ``PrefixIndex.apply``. Everything derived
(``active_refs``, ``restore_pins``, ``live_snapshots_below``, LRU and dead-list membership) is declared
here with the invariant that ``check_integrity`` rebuilds it from.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Sequence
from enum import IntEnum
from typing import NewType

from hybridcache.cache.ids import BLOCK_TOKENS, NodeId, PageId, SlabId, SlotId, SnapshotId

LaneId = NewType("LaneId", int)
"""An active sequence: chosen by the engine (0 .. max_concurrency-1 is typical, any int works)."""

RestoreBatchId = NewType("RestoreBatchId", int)
HostWriteBatchId = NewType("HostWriteBatchId", int)


_BLOCK_LAYOUT = struct.Struct(f"<{BLOCK_TOKENS}I")  # one full block: the common case, twice as fast


def pack_tokens(tokens: Sequence[int]) -> bytes:
    """Tokens as packed little-endian uint32, the layout ``hashing`` hashes. Pure. Raises OverflowError
    for a token outside uint32."""
    if len(tokens) == BLOCK_TOKENS:
        try:
            return _BLOCK_LAYOUT.pack(*tokens)
        except struct.error:
            pass  # let array raise its usual OverflowError (or TypeError) below
    packed = array("I", tokens)
    if sys.byteorder == "big":  # pragma: no cover - little-endian everywhere we run
        packed.byteswap()
    return packed.tobytes()


class Residency(IntEnum):
    """One copy (device or host) of a node, tail or image."""

    ABSENT = 0
    RESIDENT = 1
    FILLING = 2  # a transfer is writing it; readers wait, nobody frees it


class SnapshotKind(IntEnum):
    TAP = 0
    ENDPOINT = 1
    OUTPUT_BOUNDARY = 2
    BOUNDARY = 3  # explicit / structural tap: superseded only while the tree below it is one chain
    HEDGE = 4  # a tail hedge a few hundred tokens before a prompt end (tap_planner): short-lived


class LruList(IntEnum):
    """Which device LRU list an entry is on (§9.1): host-backed entries are consumed first."""

    NONE = 0
    BACKED = 1
    UNBACKED = 2


class SlotRole(IntEnum):
    FREE = 0
    ACTIVE = 1  # a lane's working state image
    SNAPSHOT = 2  # a published snapshot's device image
    STAGING = 3  # a lane's pending tap (copied, not yet published)


class PageOwnerKind(IntEnum):
    LANE = 1  # Active: private to one lane
    NODE = 2  # Cached (or Filling) copy of a block node
    TAIL = 3  # Cached (or Filling) copy of a snapshot's partial tail page


class SlabOwnerKind(IntEnum):
    NODE = 1
    IMAGE = 2
    TAIL = 3


# Enum members bound once: reading a member off its Enum class costs ~100 ns in CPython 3.11, and every
# committed block builds a node.
_ABSENT, _RESIDENT = Residency.ABSENT, Residency.RESIDENT
_LRU_NONE = LruList.NONE


LIVE_BELOW_CAP = 3
"""Where ``BlockNode.live_snapshots_below`` saturates: its readers tell 0, 1, 2 and more apart."""


class LruLinks:
    """Intrusive doubly linked list membership shared by nodes and snapshot tails (§9.1)."""

    __slots__ = ("lru_list", "lru_next", "lru_prev")

    def __init__(self) -> None:
        self.lru_prev: LruLinks | None = None
        self.lru_next: LruLinks | None = None
        self.lru_list = _LRU_NONE


class BlockNode(LruLinks):
    """One 64-token block of the tree (§5.2). Identity fields never change after insertion.

    Invariants: ``lru_list != NONE`` iff device RESIDENT, active_refs == 0, restore_pins == 0 (and not
    root); ``live_snapshots_below`` counts the snapshots whose anchor is this node or a descendant, exactly
    up to ``LIVE_BELOW_CAP - 1`` and saturating above: it is the snapshots anchored here plus, per child,
    ``min(child.live_snapshots_below, LIVE_BELOW_CAP)``. So it is 0, 1 or 2 exactly when that many
    snapshots lie below, and at least ``LIVE_BELOW_CAP`` when more do; a publish or a retirement walks up
    only while a node's capped value changes (never past a node with ``LIVE_BELOW_CAP`` below it).
    """

    # Slots are laid out in this order after the inherited LRU links: the fields that the walks over a path
    # read (parent walk, pins, liveness, dead list) come first so they sit together at the object's start.
    __slots__ = (  # noqa: RUF023 - ordered for memory locality, not alphabetically
        "parent",
        "live_snapshots_below",
        "active_refs",
        "restore_pins",
        "last_access_tick",
        "snapshots",
        "device_state",
        "host_state",
        "id",
        "device_page",
        "host_slab",
        "depth",
        "children",
        "lookup_hash",
        "extra",
        "token_bytes",
        "tokens",
        "inexact",
    )

    def __init__(
        self, node_id: NodeId, parent: BlockNode | None, lookup_hash: int, tokens: tuple[int, ...], extra: int
    ) -> None:
        self.lru_prev = self.lru_next = None  # LruLinks fields, set inline (one node per committed block)
        self.lru_list = _LRU_NONE
        self.id = node_id
        self.parent = parent
        self.depth = -1 if parent is None else parent.depth + 1  # block index; root is -1
        self.lookup_hash = lookup_hash
        self.tokens = tokens
        self.token_bytes: bytes | None = None  # packed on first match (``packed_tokens``), never in apply
        self.extra = extra
        # lookup_hash -> the child under it, or a list of them when lookup hashes collide: a lone child
        # is stored as itself, so a committed block allocates no bucket list (``add_child``).
        self.children: dict[int, BlockNode | list[BlockNode]] = {}
        self.device_page: PageId | None = None
        self.host_slab: SlabId | None = None
        self.device_state = _ABSENT
        self.host_state = _ABSENT
        self.active_refs = 0
        self.restore_pins = 0
        self.live_snapshots_below = 0
        self.last_access_tick = 0
        # Anchored here, in publication order. A tuple, replaced when one is added or removed: most nodes
        # anchor none and share the empty tuple, so a committed block allocates no list for them.
        self.snapshots: tuple[Snapshot, ...] = ()
        # Its KV came from decode steps (one-row products), whose low bits no cold prefill reproduces:
        # an exact resume never maps it (``match``), and a prefill of the same block replaces its copy.
        self.inexact = False

    def packed_tokens(self) -> bytes:
        """The tokens as packed uint32 little-endian, for the byte-wise match walk (§6.1).

        Packed on first use and kept in ``token_bytes``: a memo of identity fields that never change, not
        logical state (no digest, no event). Applying an event never packs, so a replay pays nothing for
        nodes no prompt reaches. Mutates only the memo; raises nothing for tokens the tree accepted."""
        packed = self.token_bytes
        if packed is None:
            packed = self.token_bytes = pack_tokens(self.tokens)
        return packed

    def child(self, lookup_hash: int, tokens: tuple[int, ...], extra: int) -> BlockNode | None:
        """The child with exactly these tokens and extra key; the hash only selects candidates."""
        for candidate in self.children_under(lookup_hash):
            if candidate.tokens == tokens and candidate.extra == extra:
                return candidate
        return None

    def children_under(self, lookup_hash: int) -> Sequence[BlockNode]:
        """The children filed under ``lookup_hash`` (empty, one, or several that collide). Pure."""
        entry = self.children.get(lookup_hash)
        if entry is None:
            return ()
        return entry if entry.__class__ is list else (entry,)  # type: ignore[return-value]

    def iter_children(self) -> list[BlockNode]:
        out: list[BlockNode] = []
        for entry in self.children.values():
            if entry.__class__ is list:
                out += entry  # type: ignore[arg-type]
            else:
                out.append(entry)  # type: ignore[arg-type]
        return out

    def add_child(self, node: BlockNode) -> None:
        """File ``node`` under its lookup hash, after any child already there. Mutates."""
        children, key = self.children, node.lookup_hash
        entry = children.get(key)
        if entry is None:
            children[key] = node
        elif entry.__class__ is list:
            entry.append(node)  # type: ignore[union-attr]
        else:
            children[key] = [entry, node]  # type: ignore[list-item]

    def remove_child(self, node: BlockNode) -> None:
        """Unfile ``node`` (a child of this node). Mutates; raises KeyError / ValueError if absent."""
        children, key = self.children, node.lookup_hash
        entry = children[key]
        if entry.__class__ is list:
            entry.remove(node)  # type: ignore[union-attr]
            if entry:
                return
        elif entry is not node:
            raise ValueError(f"node {node.id} is not a child of node {self.id}")
        del children[key]

    @property
    def pinned(self) -> bool:
        return self.active_refs > 0 or self.restore_pins > 0


class Snapshot(LruLinks):
    """A recurrent-state snapshot at frontier F on its anchor's path, with an optional tail (§5.3).

    The LRU links hold the snapshot's *tail page* on the device LRU (present iff tail device RESIDENT
    and restore_pins == 0). ``ancestor`` is the nearest snapshot above it on its path; ``dependents``
    the snapshots that record it as theirs (§9.3).
    """

    __slots__ = (
        "ancestor",
        "anchor",
        "base_l",
        "dependents",
        "device_slot",
        "device_state",
        "frontier",
        "gdsf_h",
        "hits",
        "host_slabs",
        "host_state",
        "id",
        "inexact",
        "kind",
        "last_hit_tick",
        "published_tick",
        "restore_pins",
        "superseded",
        "superseded_tick",
        "tail_device_page",
        "tail_device_state",
        "tail_host_slab",
        "tail_host_state",
        "tail_tokens",
    )

    def __init__(
        self, snapshot_id: SnapshotId, anchor: BlockNode, tail_tokens: tuple[int, ...], kind: SnapshotKind
    ) -> None:
        self.lru_prev = self.lru_next = None  # LruLinks fields, set inline
        self.lru_list = _LRU_NONE
        self.id = snapshot_id
        self.anchor = anchor
        self.tail_tokens = tail_tokens
        self.frontier = 64 * (anchor.depth + 1) + len(tail_tokens)
        self.kind = kind
        self.tail_device_page: PageId | None = None
        self.tail_host_slab: SlabId | None = None
        self.tail_device_state = _ABSENT
        self.tail_host_state = _ABSENT
        self.device_slot: SlotId | None = None
        self.host_slabs: tuple[SlabId, ...] = ()
        self.device_state = _ABSENT
        self.host_state = _ABSENT
        self.restore_pins = 0
        self.superseded = False
        self.superseded_tick = 0
        self.gdsf_h = 0.0
        self.base_l = 0.0
        self.hits = 0
        self.last_hit_tick = 0
        self.published_tick = 0
        self.ancestor: Snapshot | None = None
        self.dependents: dict[SnapshotId, Snapshot] = {}
        # Resuming from it does not reproduce a cold run bit for bit (``cache/exactness.py`` says which
        # snapshots are): an exact resume never starts from it.
        self.inexact = False

    @property
    def has_tail(self) -> bool:
        return bool(self.tail_tokens)

    @property
    def device_complete(self) -> bool:
        """Image in a device slot and tail (if any) device resident: restorable without the host."""
        tail_ok = not self.tail_tokens or self.tail_device_state == _RESIDENT
        return self.device_state == _RESIDENT and tail_ok

    @property
    def host_complete(self) -> bool:
        tail_ok = not self.tail_tokens or self.tail_host_state == _RESIDENT
        return self.host_state == _RESIDENT and tail_ok


class PendingTap:
    """A tap copied into a staging slot, waiting for its anchor blocks to commit (§7.4)."""

    __slots__ = ("boundary", "hedge", "position", "slot")

    def __init__(self, position: int, slot: SlotId, boundary: bool, hedge: bool = False) -> None:
        self.position = position
        self.slot = slot
        self.boundary = boundary
        self.hedge = hedge


class Lane:
    """An active sequence: its pinned path, its block table, private pages and state slot.

    ``path[b]`` is the node the lane pins for block b (active_refs); ``table[b]`` the page the lane
    maps for block b: the node's page, or a private page (recomputed region, Duplicate, growth).
    """

    __slots__ = (
        "activated",
        "backed_spans",
        "base",
        "enabled",
        "id",
        "lineage",
        "path",
        "pending_taps",
        "private",
        "resumed_from",
        "slot",
        "source",
        "table",
        "unlisted_when_staged",
    )

    def __init__(self, lane_id: LaneId, enabled: bool, slot: SlotId, base: int) -> None:
        self.id = lane_id
        self.enabled = enabled
        self.slot: SlotId | None = slot
        self.base = base  # F_s the lane resumed from
        self.path: list[BlockNode] = []
        self.table: list[PageId] = []
        self.private: dict[PageId, None] = {}  # ordered set of Active pages
        self.source: Snapshot | None = None  # pinned until activation
        self.resumed_from: SnapshotId | None = None  # the snapshot staged from (may be gone since)
        self.lineage: SnapshotId | None = None  # previous tap published by this lane in this prompt
        self.pending_taps: dict[int, PendingTap] = {}
        self.activated = False
        # Until activation: the path nodes that were on no device LRU list when the lane pinned them,
        # deepest first. Only they can lack a device page (a listed node has one, and nothing takes a
        # pinned node's page), so LaneActivated checks just these.
        self.unlisted_when_staged: list[BlockNode] = []
        # Block ranges (first, last) of the staged path that left the host-backed LRU list when the lane
        # pinned them, deepest first: at release they rejoin it without residency tests (``unpin_path``).
        self.backed_spans: list[tuple[int, int]] = []


class RestoreBatch:
    """Host -> device copies for one admission: nodes, a tail, an image into the lane's slot (§6.4)."""

    __slots__ = ("image", "lane", "nodes", "snapshot", "tail")

    def __init__(
        self, lane: LaneId | None, nodes: list[BlockNode], snapshot: Snapshot | None, tail: bool, image: bool
    ) -> None:
        self.lane = lane
        self.nodes = nodes
        self.snapshot = snapshot
        self.tail = tail
        self.image = image


class HostWriteBatch:
    """Device -> host write of nodes (write-through or write-back), snapshot images and tails (§7.6,
    §7.4, ``cache/write_back.py``)."""

    __slots__ = ("images", "nodes", "tails")

    def __init__(self, nodes: list[BlockNode], images: list[Snapshot], tails: list[Snapshot]) -> None:
        self.nodes = nodes
        self.images = images
        self.tails = tails
