"""What the future says about a cached snapshot or block: the knowledge behind ``--explain`` and ``--told``.

Both run ``ours`` twice: the first run gives the admission order, and the second looks at its cache with
it. A snapshot is *needed* by the next request that passes its anchor block but none of the anchors of
the snapshots just below it (``FutureUses.next_use``: such a request resumes from the deeper one); it
is *dead* when no later request needs it. State is *ended* when the last request whose prompt held it
(for a block no prompt held, such as the output of a conversation's last request, its deepest ancestor
that one held) belongs to a conversation that has sent its last request: to a server it looks like the
state of an idle conversation that will return. Mutable (the future moves as requests are admitted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hybridcache.cache.records import BlockNode, Snapshot
from hybridcache.tools.sim.oracle import NEVER, FutureUses


class Hindsight:
    """The admission order of an earlier run, and per rank its request's conversation."""

    def __init__(self) -> None:
        self.future = FutureUses(())
        self._conversation_at: list[Any] = []  # per rank of the future: its conversation
        self._last_rank: dict[Any, int] = {}  # conversation -> rank of its last request

    def know(self, admitted: Sequence[tuple[Any, Sequence[int]]]) -> None:
        """The admission order to watch: (request key, its prompt's full-block lookup hashes) per request,
        as ``Simulation.admitted`` lists them; a key names its ``conversation``. Mutates."""
        self.future = FutureUses(admitted)
        self._conversation_at = [key.conversation for key, _ in admitted]
        self._last_rank = {conversation: rank for rank, conversation in enumerate(self._conversation_at)}

    def needed_at(self, snap: Snapshot) -> float:
        """The rank of the next request that would resume from ``snap``; NEVER when none would. Pure
        (moves only ``FutureUses``' cursors)."""
        deeper = [(d.anchor.depth, d.anchor.lookup_hash) for d in snap.dependents.values()
                  if d.anchor is not snap.anchor]
        return self.future.next_use(snap.anchor.lookup_hash, deeper)

    def dead(self, snap: Snapshot) -> bool:
        return self.needed_at(snap) == NEVER

    def ended(self, node: BlockNode) -> bool:
        """The last request whose prompt held ``node`` (or its deepest ancestor one held) belongs to a
        conversation with no request left. Pure."""
        rank = None
        while rank is None and node.parent is not None:
            rank = self.future.last_holder(node.lookup_hash)
            node = node.parent
        return rank is not None and self._last_rank[self._conversation_at[rank]] < self.future.position
