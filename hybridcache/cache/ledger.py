"""Device page and state-slot ownership (§5.4, §10 invariant 1). The index decides ids; gpu/ moves bytes.

A page group is Free, Active (one lane), or owned by a node / snapshot tail (Cached, or Filling while
the owner's device copy is FILLING). State slots hold C active images and D snapshot / staging images;
roles are a map, so an endpoint snapshot is a role change. Mutated only through ``PrefixIndex.apply``.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice

from hybridcache.cache.ids import PageId, SlotId
from hybridcache.cache.records import PageOwnerKind, SlotRole

PageOwner = tuple[PageOwnerKind, int]


# Enum members bound once: reading a member off its Enum class costs ~100 ns in CPython 3.11.
_SLOT_FREE = SlotRole.FREE
_SLOT_ACTIVE = SlotRole.ACTIVE
_SLOT_SNAPSHOT = SlotRole.SNAPSHOT
_SLOT_STAGING = SlotRole.STAGING


class DevicePages:
    """Owner per page; an insertion-ordered free set so ``peek_free`` is deterministic."""

    __slots__ = ("_free", "owners")

    def __init__(self, num_pages: int) -> None:
        self.owners: list[PageOwner | None] = [None] * num_pages
        self._free: dict[int, None] = dict.fromkeys(range(num_pages))

    @property
    def num_pages(self) -> int:
        return len(self.owners)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def peek_free(self, count: int) -> list[PageId] | None:
        """The pages an allocation of ``count`` would take (pure); None when fewer are free."""
        if count > len(self._free):
            return None
        return [PageId(p) for p in islice(self._free, count)]

    def is_free(self, page: int) -> bool:
        return 0 <= page < len(self.owners) and self.owners[page] is None

    def owner(self, page: int) -> PageOwner | None:
        return self.owners[page]

    def assign(self, page: int, kind: PageOwnerKind, owner: int) -> None:
        """Give a free page to an owner. Mutates; caller validated that it is free."""
        del self._free[page]
        self.owners[page] = (kind, owner)

    def all_free(self, pages: Iterable[int]) -> bool:
        """Whether every page is in range and free. Pure."""
        owners = self.owners
        count = len(owners)
        return all(0 <= page < count and owners[page] is None for page in pages)

    def assign_run(self, pages: Iterable[int], kind: PageOwnerKind, owner: int) -> None:
        """``assign`` for each page, one owner. Mutates; caller validated that they are free."""
        free, owners, owned_by = self._free, self.owners, (kind, owner)
        for page in pages:
            del free[page]
            owners[page] = owned_by

    def transfer(self, page: int, kind: PageOwnerKind, owner: int) -> None:
        """Change the owner of an owned page (lane -> node, lane -> tail). Mutates."""
        self.owners[page] = (kind, owner)

    def release(self, page: int) -> None:
        """Return an owned page to the free set. Mutates."""
        self.owners[page] = None
        self._free[page] = None

    def free_order(self) -> list[int]:
        return list(self._free)


class StateSlots:
    """C + D slots with roles; active ≤ C, snapshot + staging ≤ D.

    ``role_counts[role]`` is derived (slots holding each role), kept by ``set_role`` so the capacity
    checks of every admission and tap are O(1); ``check_integrity`` recounts it.
    """

    __slots__ = ("max_active", "max_snapshot", "owners", "role_counts", "roles")

    def __init__(self, max_active: int, max_snapshot: int) -> None:
        self.max_active = max_active
        self.max_snapshot = max_snapshot
        total = max_active + max_snapshot
        self.roles: list[SlotRole] = [_SLOT_FREE] * total
        self.owners: list[int | None] = [None] * total
        self.role_counts = [0] * len(SlotRole)
        self.role_counts[_SLOT_FREE] = total

    def count(self, *roles: SlotRole) -> int:
        return sum(self.role_counts[role] for role in roles)

    @property
    def num_snapshot_class(self) -> int:
        counts = self.role_counts
        return counts[_SLOT_SNAPSHOT] + counts[_SLOT_STAGING]

    @property
    def num_active(self) -> int:
        return self.role_counts[_SLOT_ACTIVE]

    def can_add_snapshot_class(self) -> bool:
        """A staging tap or a new snapshot image fits within D. Pair of ``set_role``."""
        return self.num_snapshot_class < self.max_snapshot

    def can_add_active(self) -> bool:
        return self.role_counts[_SLOT_ACTIVE] < self.max_active

    def peek_free(self) -> SlotId | None:
        """The lowest free slot (pure); None when all are taken."""
        for slot, role in enumerate(self.roles):
            if role == _SLOT_FREE:
                return SlotId(slot)
        return None

    def set_role(self, slot: int, role: SlotRole, owner: int | None) -> None:
        """Mutates; caller validated the transition."""
        counts = self.role_counts
        counts[self.roles[slot]] -= 1
        counts[role] += 1
        self.roles[slot] = role
        self.owners[slot] = owner
