"""Every mutation of the prefix index as a frozen, tagged, array-like msgspec Struct.

Policy code reads the index and emits these; ``PrefixIndex.apply`` is the only code that changes state.
An event carries every id and value its application needs (node, page, slab and slot ids, the GDSF
values), so replaying a journal never re-runs a policy. Structural consequences that follow from the
data alone (a deleted node's subtree, the ancestor links of a snapshot) are derived by apply.

Schema evolution: fields are append-only; new fields get defaults.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec


class _Event(msgspec.Struct, frozen=True, tag=True, array_like=True):
    seq: int


class Checkpoint(_Event, frozen=True):
    """A digest of the index state after event ``seq - 1`` (replay proves it): of slice ``part`` of
    ``parts`` (``cache/digest.py``); ``parts == 1`` digests the whole state."""

    digest: int
    part: int = 0
    parts: int = 1


class RestoreOpened(_Event, frozen=True):
    """Host-only path blocks, tail and/or image of ``snapshot`` start copying to the device.

    Nodes and tail become device FILLING on the given (free) pages; the batch pins what it copies.
    """

    batch: int
    lane: int | None
    nodes: tuple[int, ...]
    pages: tuple[int, ...]
    snapshot: int | None = None
    tail_page: int | None = None
    image: bool = False  # the image is restored into the staged lane's own slot


class RestoreLanded(_Event, frozen=True):
    batch: int


class LaneStaged(_Event, frozen=True):
    """A lane pins its path, the ``base // 64`` blocks from block 0 down to ``path_end`` (None when the
    path is empty), pins ``snapshot`` until activation, takes an active slot and private pages (the first
    private page maps the block after ``path_end``). The tree holds one chain above a node, so its deepest
    node names the path: the event stays small however long the conversation grows."""

    lane: int
    enabled: bool
    slot: int
    base: int
    path_end: int | None
    private_pages: tuple[int, ...]
    snapshot: int | None = None


class LaneActivated(_Event, frozen=True):
    """The lane's fork is enqueued: the staging pin on its source snapshot is dropped."""

    lane: int


class LanePagesGranted(_Event, frozen=True):
    """Free pages become private (Active) pages of the lane, appended to its block table."""

    lane: int
    pages: tuple[int, ...]


class LaneReleased(_Event, frozen=True):
    """The lane ends: path nodes are unpinned (LRU tail-first), private pages and its slot are freed,
    pending taps are dropped."""

    lane: int


class BlockInserted(_Event, frozen=True):
    """A new node for the lane's next block, owning the lane's page for that block, pinned by it."""

    lane: int
    node: int
    lookup_hash: int
    tokens: tuple[int, ...]
    extra: int = 0
    inexact: bool = False  # its KV came from decode steps (records.BlockNode.inexact)


class BlockAdopted(_Event, frozen=True):
    """An existing host-only node adopts the lane's page as its device copy; the lane pins it."""

    lane: int
    node: int


class BlockMadeExact(_Event, frozen=True):
    """An existing inexact node matches the lane's next block, which the lane computed exactly: the
    lane's page becomes the node's device copy, the node's old device page is freed, its (inexact) host
    copy is dropped, and the lane pins the node. The node is on no other lane's path and nothing copies
    it."""

    lane: int
    node: int


class BlockDuplicated(_Event, frozen=True):
    """An existing device-resident node matches the lane's next block: the lane's page stays private,
    the lane pins the node."""

    lane: int
    node: int


class DeviceCopiesDropped(_Event, frozen=True):
    """Host-backed LRU entries (nodes, snapshot tails) give up their device page (§9.1)."""

    nodes: tuple[int, ...] = ()
    tails: tuple[int, ...] = ()


class SubtreeDeleted(_Event, frozen=True):
    """A node loses its last copy: it, its subtree and every snapshot anchored there go (§9.4)."""

    node: int


class NodeHostDropped(_Event, frozen=True):
    """Dead-KV sweep: the node's host slab is freed; without a device copy its subtree goes (§9.4)."""

    node: int


class PinnedHostCopiesDropped(_Event, frozen=True):
    """The host slabs of blocks that running lanes pin on the device are freed; the device copies stay.
    While a lane runs, its device copy is the one in use and the host copy only duplicates it
    (``host_eviction.pinned_duplicates``); once unpinned, such a block is device-only, and write-back
    copies it again if the device evicts it while a snapshot can still reach it."""

    nodes: tuple[int, ...]


class TapTaken(_Event, frozen=True):
    """The lane's state at ``position`` was copied into a free slot, now STAGING (§7.4)."""

    lane: int
    position: int
    slot: int
    boundary: bool = False
    hedge: bool = False  # published as a SnapshotKind.HEDGE


class TapDropped(_Event, frozen=True):
    lane: int
    position: int


class SnapshotPublished(_Event, frozen=True):
    """A new snapshot anchored on the lane's path. A tap's image is its staging slot (``position`` names
    the pending tap); an endpoint's is the lane's active slot (role change). A tail page is either a
    lane private page that moves (endpoint) or a free page the engine copies into."""

    snapshot: int
    lane: int
    kind: int
    anchor: int
    tail_tokens: tuple[int, ...]
    tail_page: int | None
    position: int | None  # pending tap position; None for an endpoint
    gdsf_h: float = 0.0
    inexact: bool = False  # records.Snapshot.inexact


class SnapshotHit(_Event, frozen=True):
    """A lane resumes from the snapshot: hits + 1, its L base refreshed."""

    snapshot: int


class SnapshotSuperseded(_Event, frozen=True):
    snapshot: int


class SnapshotRetained(_Event, frozen=True):
    snapshot: int


class SnapshotsValued(_Event, frozen=True):
    """GDSF priorities H recomputed by the host policy (§9.3)."""

    snapshots: tuple[int, ...]
    values: tuple[float, ...]


class GdsfInflated(_Event, frozen=True):
    """L rises to a victim's priority; never falls."""

    inflation: float


class SnapshotDeviceDropped(_Event, frozen=True):
    """The snapshot's image leaves its device slot (it keeps its complete host copy)."""

    snapshot: int


class SnapshotHostDropped(_Event, frozen=True):
    """The snapshot's host image (and host tail) slabs are freed; it stays complete on the device."""

    snapshot: int


class SnapshotDeleted(_Event, frozen=True):
    snapshot: int


class HostWriteOpened(_Event, frozen=True):
    """Write-through: device-only nodes, images and tails start copying into the given slabs."""

    batch: int
    nodes: tuple[int, ...] = ()
    node_slabs: tuple[int, ...] = ()
    images: tuple[int, ...] = ()
    image_slabs: tuple[tuple[int, ...], ...] = ()
    tails: tuple[int, ...] = ()
    tail_slabs: tuple[int, ...] = ()


class HostWriteLanded(_Event, frozen=True):
    batch: int


class BlockLoaded(_Event, frozen=True):
    """A block read back from a prefix-cache file (§5.5): a new host-only node under ``parent`` whose
    bytes are already in ``slab``. Parents are loaded before children."""

    node: int
    parent: int
    lookup_hash: int
    tokens: tuple[int, ...]
    extra: int
    slab: int
    inexact: bool = False  # saved with its mark (records.BlockNode.inexact)


class SnapshotLoaded(_Event, frozen=True):
    """A snapshot read back from a prefix-cache file (§5.5): retained, host-only, its image (and tail)
    bytes already in the given slabs, anchored on a loaded (or the root) node."""

    snapshot: int
    anchor: int
    kind: int
    tail_tokens: tuple[int, ...]
    image_slabs: tuple[int, ...]
    tail_slab: int | None
    hits: int = 0
    inexact: bool = False  # saved with its mark (records.Snapshot.inexact)


CacheEvent = (
    Checkpoint
    | RestoreOpened
    | RestoreLanded
    | LaneStaged
    | LaneActivated
    | LanePagesGranted
    | LaneReleased
    | BlockInserted
    | BlockAdopted
    | BlockDuplicated
    | BlockMadeExact
    | DeviceCopiesDropped
    | SubtreeDeleted
    | NodeHostDropped
    | TapTaken
    | TapDropped
    | SnapshotPublished
    | SnapshotHit
    | SnapshotSuperseded
    | SnapshotRetained
    | SnapshotsValued
    | GdsfInflated
    | SnapshotDeviceDropped
    | SnapshotHostDropped
    | SnapshotDeleted
    | HostWriteOpened
    | HostWriteLanded
    | BlockLoaded
    | SnapshotLoaded
    | PinnedHostCopiesDropped
)

_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(CacheEvent)


encode_event: Callable[[CacheEvent], bytes] = _ENCODER.encode
"""msgpack bytes of one event (no framing): ``encode_event(event) -> bytes``. Pure. The encoder's own bound
method, so journaling an event costs no Python call frame."""


def decode_event(data: bytes) -> CacheEvent:
    """The event encoded in ``data``. Raises msgspec.ValidationError / DecodeError on bad input."""
    return _DECODER.decode(data)
