"""The device LRU (§9.1): two intrusive doubly linked lists with sentinels, host-backed and unbacked.

Entries are block nodes and snapshot tails (anything with ``LruLinks``). The head of a list is its
least recently used end; entries join at the MRU end. Owned and mutated only by ``PrefixIndex.apply``.

Lane staging and release move whole paths (about 90 nodes per request on average) off and back onto the
lists. Those two transitions are the hottest loops of the index, so besides the single-entry
``push_mru`` / ``remove`` there are ``pin_chain`` / ``unpin_path``: one pass per path that does the pin
counting and the list splicing together, with the list ends bound to locals, then a short pass over the
path's deepest nodes for the dead list. ``pin_chain`` cuts runs of consecutive entries out with one
splice each and records the host-backed ones, which ``unpin_path`` puts back without residency tests.
Write-through batches use ``extend_mru`` / ``remove_all``: the single-entry calls in one loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from hybridcache.cache.records import LruLinks, LruList, Residency

if TYPE_CHECKING:
    from hybridcache.cache.ids import NodeId
    from hybridcache.cache.records import BlockNode

_NONE, _BACKED, _UNBACKED = LruList.NONE, LruList.BACKED, LruList.UNBACKED
_RESIDENT = Residency.RESIDENT
_NO_RUN = LruLinks()  # ``pin_chain``'s open run when there is none: no entry's link ever points at it


class _Sentinel(LruLinks):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self.lru_prev = self
        self.lru_next = self


class DeviceLru:
    """Two lists; ``push_mru`` / ``remove`` are O(1), the path forms O(len(path)). Mutating calls raise
    ValueError on misuse.

    Links are read only for listed entries. A node that a lane pins may keep stale links (``pin_chain``
    leaves the inner links of a run it cuts out); every other entry on no list has none (both None):
    ``pin_chain`` relies on that to tell a listed node by a link alone."""

    __slots__ = ("_backed", "_counts", "_unbacked")

    def __init__(self) -> None:
        self._backed = _Sentinel()
        self._unbacked = _Sentinel()
        self._counts = [0, 0, 0]  # indexed by int(LruList); slot 0 (NONE) stays 0

    def __len__(self) -> int:
        counts = self._counts
        return counts[_BACKED] + counts[_UNBACKED]

    def count(self, which: LruList) -> int:
        return self._counts[which]

    def _sentinel(self, which: LruList) -> _Sentinel:
        if which == _BACKED:
            return self._backed
        if which == _UNBACKED:
            return self._unbacked
        raise ValueError(f"{which!r} is not a device LRU list")

    def push_mru(self, entry: LruLinks, which: LruList) -> None:
        """Append ``entry`` at the MRU end of ``which``. Mutates; raises ValueError if already listed or
        ``which`` is not a list."""
        if entry.lru_list is not _NONE:
            raise ValueError("entry is already on a device LRU list")
        if which is _BACKED:
            sentinel = self._backed
        elif which is _UNBACKED:
            sentinel = self._unbacked
        else:
            sentinel = self._sentinel(which)  # an int equal to a member, or a bad value (raises)
            which = _BACKED if sentinel is self._backed else _UNBACKED  # store a member, not an int
        last = sentinel.lru_prev
        entry.lru_prev = last
        entry.lru_next = sentinel
        last.lru_next = entry  # type: ignore[union-attr]
        sentinel.lru_prev = entry
        entry.lru_list = which
        self._counts[which] += 1

    def remove(self, entry: LruLinks) -> None:
        """Unlink ``entry`` if listed (no-op otherwise). Mutates."""
        which = entry.lru_list
        if which is _NONE:
            return
        prev, nxt = entry.lru_prev, entry.lru_next
        assert prev is not None and nxt is not None
        prev.lru_next = nxt
        nxt.lru_prev = prev
        entry.lru_prev = entry.lru_next = None
        entry.lru_list = _NONE
        self._counts[which] -= 1

    def extend_mru(self, entries: Sequence[LruLinks], which: LruList) -> None:
        """``push_mru(entry, which)`` for each entry in order (none may be listed; the caller checked).
        Mutates; raises ValueError if ``which`` is not a list."""
        sentinel = self._sentinel(which)
        which = _BACKED if sentinel is self._backed else _UNBACKED  # a member, not an equal int
        last = sentinel.lru_prev
        for entry in entries:
            entry.lru_prev = last
            last.lru_next = entry  # type: ignore[union-attr]
            entry.lru_list = which
            last = entry
        last.lru_next = sentinel  # type: ignore[union-attr]
        sentinel.lru_prev = last
        self._counts[which] += len(entries)

    def remove_all(self, entries: Sequence[LruLinks]) -> None:
        """``remove(entry)`` for each entry (unlisted ones are skipped). Mutates."""
        counts, none = self._counts, _NONE
        for entry in entries:
            which = entry.lru_list
            if which is none:
                continue
            prev, nxt = entry.lru_prev, entry.lru_next
            prev.lru_next = nxt  # type: ignore[union-attr]
            nxt.lru_prev = prev  # type: ignore[union-attr]
            entry.lru_prev = entry.lru_next = None
            entry.lru_list = none
            counts[which] -= 1

    def pin_chain(
        self,
        deepest: BlockNode | None,
        blocks: int,
        tick: int,
        dead: dict[NodeId, BlockNode],
        unlisted: list[BlockNode],
        backed_spans: list[tuple[int, int]],
    ) -> list[BlockNode]:
        """A lane maps the path of ``blocks`` blocks ending at ``deepest`` (§6.4); returns it from block 0.
        Walking up from ``deepest``: active_refs + 1 and last access = ``tick`` on every node; a node
        pinned for the first time leaves its list (pinned nodes are never listed, §9.1) and ``dead``.
        The nodes that were on no list are appended to ``unlisted``, deepest first, and the block ranges
        (first, last) of those that left the host-backed list to ``backed_spans``, deepest first (see
        ``unpin_path``). Mutates the nodes, the lists, ``dead``, ``unlisted`` and ``backed_spans``; the
        caller checked that ``deepest`` is at depth ``blocks - 1`` (None for an empty path).

        A released path joined its list deepest block first and a landed write batch in block order, so
        going up the path usually meets a list neighbour of the node before it. The walk leaves such a
        run of consecutive entries linked while it grows at either end and cuts it out with one splice
        when it ends (``_cut_run``)."""
        if deepest is None:
            return []
        path: list[BlockNode] = [None] * blocks  # type: ignore[list-item]  # every entry set below
        none, no_run, cut, off_list = _NONE, _NO_RUN, self._cut_run, unlisted.append
        # The open run: the nodes unlinked from block ``run_start`` down, consecutive on list ``run_list``
        # from ``run_head`` (nearer the LRU end) to ``run_tail``, still linked among themselves and to
        # their old neighbours; none is open while both ends are no_run.
        run_head = run_tail = no_run
        run_list, run_start = none, 0
        node = deepest
        for block in range(blocks - 1, -1, -1):
            path[block] = node
            node.last_access_tick = tick
            if node.active_refs:  # pinned already: on no list and not dead
                node.active_refs += 1
                off_list(node)
                if run_tail is not no_run:
                    cut(run_head, run_tail, run_list, block + 1, run_start, backed_spans)
                    run_head = run_tail = no_run
                node = node.parent  # type: ignore[assignment]
                continue
            node.active_refs = 1
            # Only a listed node has links here (see the class note), so a link to the run lists it.
            if node.lru_prev is run_tail:  # the run grows at its MRU end (a released path)
                run_tail = node
                node.lru_list = none
            elif node.lru_next is run_head:  # ... or at its LRU end (a landed write batch)
                run_head = node
                node.lru_list = none
            else:
                if run_tail is not no_run:
                    cut(run_head, run_tail, run_list, block + 1, run_start, backed_spans)
                    run_head = run_tail = no_run
                which = node.lru_list
                if which is not none:  # a new run
                    run_head = run_tail = node
                    run_list, run_start = which, block
                    node.lru_list = none
                else:
                    off_list(node)
            node = node.parent  # type: ignore[assignment]  # block 0's parent is the root, not visited
        if run_tail is not no_run:
            cut(run_head, run_tail, run_list, 0, run_start, backed_spans)
        # Pinned nodes are not dead. Counts never fall going up a path, so the nodes with no live
        # snapshot below (the only ones that can be on the dead list) are its deepest ones.
        for node in reversed(path):
            if node.live_snapshots_below:
                break
            dead.pop(node.id, None)
        return path

    def _cut_run(
        self,
        head: LruLinks,
        tail: LruLinks,
        which: LruList,
        first: int,
        last: int,
        backed_spans: list[tuple[int, int]],
    ) -> None:
        """Splice out the consecutive entries of ``which`` from ``head`` to ``tail``: path blocks ``first``
        to ``last``, their ``lru_list`` already NONE; a host-backed run's blocks go to ``backed_spans``.
        The run's outer links are cleared; the inner ones, among its own entries, stay stale until each
        joins a list again (links are read only for listed entries). Mutates."""
        before, after = head.lru_prev, tail.lru_next
        before.lru_next = after  # type: ignore[union-attr]
        after.lru_prev = before  # type: ignore[union-attr]
        head.lru_prev = tail.lru_next = None
        self._counts[which] -= last - first + 1
        if which is _BACKED:
            backed_spans.append((first, last))

    def unpin_path(
        self,
        path: Sequence[BlockNode],
        dead: dict[NodeId, BlockNode],
        backed_spans: Sequence[tuple[int, int]] = (),
    ) -> None:
        """A lane releases ``path`` (a chain from block 0): active_refs - 1 on every node, deepest first. A
        node left without pins joins the MRU end of the list its host copy selects, so the path is appended
        in reverse block order and its deepest block is evicted first (§9.1); with no live snapshot below
        and a host copy it joins ``dead``. Mutates the nodes, the lists and ``dead``.

        ``backed_spans`` are the block ranges ``pin_chain`` cut from the host-backed list for this pin,
        deepest first: those nodes still have both copies and no transfer pin (a pinned node keeps its
        device page, a node with a host copy is written by no batch and is restored by none), so when
        their last pin goes they rejoin that list without the residency tests."""
        backed, unbacked = self._backed, self._unbacked
        last_backed, last_unbacked = backed.lru_prev, unbacked.lru_prev
        joined_unbacked = stay_off = 0  # the host-backed list gains the rest of the path
        resident, backed_list, unbacked_list = _RESIDENT, _BACKED, _UNBACKED
        end = len(path)  # the blocks from ``end`` on are done
        for first, last in (*backed_spans, (0, -1)):
            # The blocks between two spans (last + 1 .. end - 1), deepest first: test each node.
            for node in reversed(path[last + 1 : end]) if end > last + 1 else ():
                if node.active_refs != 1 or node.restore_pins:  # still pinned afterwards: joins nothing
                    refs = node.active_refs = node.active_refs - 1
                    if not refs:
                        node.lru_prev = node.lru_next = None  # links ``pin_chain`` left stale
                    stay_off += 1
                    continue
                node.active_refs = 0
                if node.device_state is not resident:
                    node.lru_prev = node.lru_next = None  # links ``pin_chain`` left stale
                    stay_off += 1
                elif node.host_state is resident:
                    node.lru_prev = last_backed
                    last_backed.lru_next = node  # type: ignore[union-attr]
                    node.lru_list = backed_list
                    last_backed = node
                else:
                    node.lru_prev = last_unbacked
                    last_unbacked.lru_next = node  # type: ignore[union-attr]
                    node.lru_list = unbacked_list
                    last_unbacked = node
                    joined_unbacked += 1
            for node in reversed(path[first : last + 1]):  # a span: back onto the host-backed list
                if node.active_refs != 1:  # another lane pins it too
                    node.active_refs -= 1
                    stay_off += 1
                    continue
                node.active_refs = 0
                node.lru_prev = last_backed
                last_backed.lru_next = node  # type: ignore[union-attr]
                node.lru_list = backed_list
                last_backed = node
            end = first
        last_backed.lru_next = backed  # type: ignore[union-attr]
        backed.lru_prev = last_backed
        last_unbacked.lru_next = unbacked  # type: ignore[union-attr]
        unbacked.lru_prev = last_unbacked
        counts = self._counts
        counts[_BACKED] += len(path) - stay_off - joined_unbacked
        counts[_UNBACKED] += joined_unbacked
        # Deepest first, as they were released: unpinned nodes with a host copy and no live snapshot
        # below. Counts never fall going up a path, so those nodes are among its deepest ones.
        for node in reversed(path):
            if node.live_snapshots_below:
                break
            if not (node.active_refs or node.restore_pins) and node.host_state is resident:
                dead[node.id] = node

    def iter_lru_first(self, which: LruList) -> Iterator[LruLinks]:
        """Entries of ``which`` from the LRU end. Pure; do not mutate the list while iterating."""
        sentinel = self._sentinel(which)
        entry = sentinel.lru_next
        while entry is not sentinel:
            assert entry is not None
            yield entry
            entry = entry.lru_next


def spans_without(spans: Sequence[tuple[int, int]], blocks: set[int]) -> list[tuple[int, int]]:
    """``spans`` ((first, last) block ranges, deepest first, as ``pin_chain`` records them) less the
    ``blocks``: a span holding some of them is cut into the ranges between them, still deepest first.
    Pure."""
    kept: list[tuple[int, int]] = []
    for first, last in spans:
        end = last
        for block in sorted((b for b in blocks if first <= b <= last), reverse=True):
            if block < end:
                kept.append((block + 1, end))
            end = block - 1
        if first <= end:
            kept.append((first, end))
    return kept
