"""ContentsFold: the durable entries a cache directory's contents journal describes, folded in order.

Used twice: the contents writer keeps one up to date as it writes (a compaction writes it out as the
new base), and a restart folds the file to learn what to verify and restore. No I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from hybridcache.persistence.contents_records import (
    BaseEnd,
    BlockReleased,
    BlockStored,
    ContentsRecord,
    ImageStored,
    NodeLinked,
    NodeRemoved,
    SnapshotRemoved,
    SnapshotState,
    TailStored,
)

ROOT = 0


class RestorableEntries(msgspec.Struct, frozen=True):
    """What a restart may restore: blocks reachable from the root (parents first) and the snapshots whose
    anchor is among them (or the root) with their image and, when they have tail tokens, their tail."""

    blocks: list[BlockStored]
    snapshots: list[tuple[ImageStored, TailStored | None]]


class ContentsFold:
    """The folded state. `apply(record)` mutates; everything else reads."""

    def __init__(self) -> None:
        self.blocks: dict[int, BlockStored] = {}
        self.images: dict[int, ImageStored] = {}
        self.tails: dict[int, TailStored] = {}
        self._children: dict[int, set[int]] = {}  # parent id -> ids of stored (or released) children
        self._parent: dict[int, int] = {}
        self._anchored: dict[int, set[int]] = {}  # node id -> snapshots with an image anchored there
        self.records_applied = 0

    @property
    def entries(self) -> int:
        """Records a base table of this state holds."""
        return len(self.blocks) + len(self.images) + len(self.tails)

    def slabs(self) -> int:
        """Slabs the stored entries occupy. Pure."""
        return len(self.blocks) + sum(len(i.slabs) for i in self.images.values()) + len(self.tails)

    def apply(self, record: ContentsRecord) -> None:
        """Fold one record. Records naming unknown ids change nothing (a removal may follow an entry that
        never became durable)."""
        self.records_applied += 1
        if isinstance(record, BlockStored):
            self.blocks[record.node] = record
            self._link(record.node, record.parent)
        elif isinstance(record, NodeLinked):
            self._link(record.node, record.parent)
        elif isinstance(record, ImageStored):
            previous = self.images.get(record.snapshot)
            if previous is not None and previous.anchor != record.anchor:
                self._unanchor(previous)
            self.images[record.snapshot] = record
            self._anchored.setdefault(record.anchor, set()).add(record.snapshot)
        elif isinstance(record, TailStored):
            self.tails[record.snapshot] = record
        elif isinstance(record, SnapshotState):
            image = self.images.get(record.snapshot)
            if image is not None:
                self.images[record.snapshot] = msgspec.structs.replace(
                    image, hits=record.hits, superseded=record.superseded
                )
        elif isinstance(record, BlockReleased):
            self.blocks.pop(record.node, None)
        elif isinstance(record, NodeRemoved):
            self._remove_subtree(record.node)
        elif isinstance(record, SnapshotRemoved):
            self._remove_snapshot(record.snapshot)
        elif isinstance(record, BaseEnd):
            pass

    def _link(self, node: int, parent: int) -> None:
        previous = self._parent.get(node)
        if previous != parent:  # a node's parent never changes; the latest record wins
            if previous is not None:
                self._unlink(node, previous)
            self._parent[node] = parent
            self._children.setdefault(parent, set()).add(node)

    def _unlink(self, node: int, parent: int) -> None:
        siblings = self._children.get(parent)
        if siblings is not None:
            siblings.discard(node)
            if not siblings:
                del self._children[parent]

    def _unanchor(self, image: ImageStored) -> None:
        anchored = self._anchored.get(image.anchor)
        if anchored is not None:
            anchored.discard(image.snapshot)
            if not anchored:
                del self._anchored[image.anchor]

    def _remove_snapshot(self, snapshot: int) -> None:
        image = self.images.pop(snapshot, None)
        if image is not None:
            self._unanchor(image)
        self.tails.pop(snapshot, None)

    def _remove_subtree(self, top: int) -> None:
        stack = [top]
        parent = self._parent.pop(top, None)
        if parent is not None:
            self._unlink(top, parent)
        while stack:
            node = stack.pop()
            self.blocks.pop(node, None)
            for snapshot in tuple(self._anchored.get(node, ())):
                self._remove_snapshot(snapshot)
            children = self._children.pop(node, set())
            for child in children:
                self._parent.pop(child, None)
            stack.extend(children)

    def base_records(self) -> Iterator[ContentsRecord]:
        """The state as a base table: the links of released nodes, blocks, images, tails, then `BaseEnd`.
        Pure."""
        links = [NodeLinked(node, parent) for node, parent in self._parent.items() if node not in self.blocks]
        yield from links
        yield from self.blocks.values()
        yield from self.images.values()
        yield from self.tails.values()
        yield BaseEnd(len(links) + self.entries)

    def restorable(self) -> RestorableEntries:
        """Blocks reachable from the root through stored blocks (parents first, breadth first) and the
        complete snapshots anchored on them. Pure."""
        blocks: list[BlockStored] = []
        reachable = {ROOT}
        frontier = [ROOT]
        while frontier:
            next_frontier = []
            for parent in frontier:
                for child in sorted(self._children.get(parent, ())):
                    block = self.blocks.get(child)
                    if block is not None:
                        blocks.append(block)
                        reachable.add(child)
                        next_frontier.append(child)
            frontier = next_frontier
        snapshots = []
        for snapshot, image in sorted(self.images.items()):
            tail = self.tails.get(snapshot)
            if image.anchor in reachable and (tail is not None) == bool(image.tail_tokens):
                snapshots.append((image, tail))
        return RestorableEntries(blocks, snapshots)
