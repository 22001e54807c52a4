"""Result structs the ``Cache`` facade returns to the engine: what to copy, where, and what happened.

Every copy list is in the order the engine must enqueue it (forward-pass order for restores).
"""

from __future__ import annotations

from enum import IntEnum

import msgspec

from hybridcache.cache.ids import PageId, SlabId, SlotId, SnapshotId
from hybridcache.cache.match import SourceKind


class StaleQuote(RuntimeError):
    """The index changed since the quote (cache_epoch differs): quote again."""


class NotReady(RuntimeError):
    """stage() was given a quote that is not Ready, or a lane id already in use."""


class StateSourceKind(IntEnum):
    RESET = 0  # start from the zero state (root)
    COPY_SLOT = 1  # device-to-device copy from a snapshot slot
    RESTORE = 2  # the image's host slabs are restored straight into the lane's slot


class SlabToPage(msgspec.Struct, frozen=True, array_like=True):
    slab: SlabId
    page: PageId


class PageToSlab(msgspec.Struct, frozen=True, array_like=True):
    page: PageId
    slab: SlabId


class PageCopy(msgspec.Struct, frozen=True, array_like=True):
    """Device-to-device copy of the first ``tokens`` positions of a page bundle (a tail COW)."""

    src: PageId
    dst: PageId
    tokens: int


class SlotToSlabs(msgspec.Struct, frozen=True, array_like=True):
    slot: SlotId
    slabs: tuple[SlabId, ...]


class RestorePlan(msgspec.Struct, frozen=True):
    """Host -> device copies of one admission, in forward order; ``restore_done(batch)`` when landed."""

    batch: int
    blocks: tuple[SlabToPage, ...]  # in block order
    tail: SlabToPage | None
    image_slabs: tuple[SlabId, ...]  # into the lane's own slot; empty when not restored


class Staged(msgspec.Struct, frozen=True):
    """What the engine does to build the lane (§6.4). ``block_table`` maps blocks 0.. to pages."""

    lane: int
    slot: SlotId
    source_kind: SourceKind
    snapshot: SnapshotId | None
    reuse_tokens: int
    block_table: tuple[PageId, ...]
    state_source: StateSourceKind
    state_source_slot: SlotId | None  # for COPY_SLOT
    tail_copy: PageCopy | None  # snapshot tail -> the lane's private page (after the restore, if any)
    restore: RestorePlan | None
    restored_host_bytes: int


class HostWritePlan(msgspec.Struct, frozen=True):
    """Device -> host write-through; ``host_write_done(batch)`` when every copy landed."""

    batch: int
    blocks: tuple[PageToSlab, ...]
    images: tuple[SlotToSlabs, ...]
    tails: tuple[PageToSlab, ...]


class CommitResult(msgspec.Struct, frozen=True):
    inserted: int
    adopted: int
    duplicates: int
    committed_blocks: int  # the lane's path length afterwards
    made_exact: int = 0  # inexact nodes whose copies the lane's exact blocks replaced


class TapResult(msgspec.Struct, frozen=True):
    """``slot`` is the staging slot to copy the lane's state into; None when the tap is skipped."""

    slot: SlotId | None
    skipped_reason: str | None = None


class PublishedTap(msgspec.Struct, frozen=True):
    snapshot: SnapshotId
    position: int
    tail_copy: PageCopy | None  # copy the first p % 64 tokens of the block into the tail page


class PublishResult(msgspec.Struct, frozen=True):
    published: tuple[PublishedTap, ...]
    dropped: tuple[int, ...]  # positions dropped (duplicate, no tail page)
    write: HostWritePlan | None


class FinishResult(msgspec.Struct, frozen=True):
    endpoint: SnapshotId | None
    endpoint_skipped: str | None
    taps: PublishResult
    write: HostWritePlan | None  # the lane's device-only blocks (+ endpoint image and tail)
