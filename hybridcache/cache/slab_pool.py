"""Host slab pool bookkeeping (spec §5.4): which slab ids are free, and where each slab lives.

The host tier is ``total_bytes`` divided into slabs of ``slab_bytes``. Memory comes in chunks of at most
``chunk_bytes`` holding whole slabs only, so a slab never crosses a chunk. A KV block bundle takes one
slab; a snapshot image takes ``image_slab_count(image_bytes)`` slabs (plus one for a tail), not
necessarily contiguous. Capacity is the number of free slabs; there is no fragmentation.

The free set is an index stack with a position index, so taking or releasing any slab is O(1)
(swap-remove). The stack starts with slab 0 on top: a fresh pool hands out low ids first and chunks fill
in order, which lets the device side allocate chunk memory lazily; released slabs are reused first.
This module holds no bytes; ``gpu/host_tier.py`` owns the memory.
"""

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from hybridcache.cache.ids import SlabId

SLAB_ALIGN_BYTES = 4096
"""Slab records are rounded up to this many bytes (spec §5.4)."""

DEFAULT_CHUNK_BYTES = 4 << 30
"""Largest single host allocation (spec §5.4: one very large pinned allocation can fail or stall)."""


class SlabLocation(NamedTuple):
    """Where a slab's bytes live: chunk index and byte offset inside that chunk."""

    chunk: int
    offset: int


def slab_bytes_for(page_bytes_by_plane: Sequence[int]) -> int:
    """Bytes of one slab: a block bundle packed plane by plane, rounded up to 4 KiB. Pure.

    Raises ValueError when a plane size is negative or the bundle is empty.
    """
    if any(plane < 0 for plane in page_bytes_by_plane):
        raise ValueError(f"plane sizes must be non-negative, got {list(page_bytes_by_plane)}")
    bundle = sum(page_bytes_by_plane)
    if bundle == 0:
        raise ValueError("a block bundle must hold at least one byte")
    return -(-bundle // SLAB_ALIGN_BYTES) * SLAB_ALIGN_BYTES


class HostSlabPool:
    """Free/used bookkeeping for the host slab tier. Mutated only by ``take`` and ``release``.

    Exhaustion is reported by ``peek_free`` returning None, never raised.
    """

    def __init__(self, slab_bytes: int, total_bytes: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        """Raises ValueError when ``slab_bytes`` <= 0, ``total_bytes`` < 0 or a chunk cannot hold a slab."""
        if slab_bytes <= 0:
            raise ValueError(f"slab_bytes must be positive, got {slab_bytes}")
        if total_bytes < 0:
            raise ValueError(f"total_bytes must be non-negative, got {total_bytes}")
        if chunk_bytes < slab_bytes:
            raise ValueError(f"chunk_bytes {chunk_bytes} cannot hold one slab of {slab_bytes} bytes")
        self.slab_bytes = slab_bytes
        self.slabs_per_chunk = chunk_bytes // slab_bytes
        self.num_slabs = total_bytes // slab_bytes
        self.num_chunks = -(-self.num_slabs // self.slabs_per_chunk)
        # Top of the stack is the end of the list: slab 0 is handed out first.
        self._free_stack: list[int] = list(range(self.num_slabs - 1, -1, -1))
        self._position: list[int | None] = list(range(self.num_slabs - 1, -1, -1))

    @property
    def num_free(self) -> int:
        """Free slabs right now."""
        return len(self._free_stack)

    @property
    def num_used(self) -> int:
        """Slabs currently taken."""
        return self.num_slabs - len(self._free_stack)

    def location(self, slab: SlabId) -> SlabLocation:
        """Chunk and byte offset of ``slab``. Pure. Raises ValueError for an id outside the pool."""
        self._check_id(slab)
        chunk, index = divmod(slab, self.slabs_per_chunk)
        return SlabLocation(chunk, index * self.slab_bytes)

    def chunk_slab_count(self, chunk: int) -> int:
        """Slabs held by ``chunk`` (the last one may hold fewer). Raises ValueError for a bad chunk."""
        if not 0 <= chunk < self.num_chunks:
            raise ValueError(f"chunk {chunk} outside [0, {self.num_chunks})")
        return min(self.slabs_per_chunk, self.num_slabs - chunk * self.slabs_per_chunk)

    def chunk_size_bytes(self, chunk: int) -> int:
        """Bytes the device side allocates for ``chunk``. Raises ValueError for a bad chunk."""
        return self.chunk_slab_count(chunk) * self.slab_bytes

    def image_slab_count(self, image_bytes: int) -> int:
        """Slabs a snapshot image of ``image_bytes`` occupies (ceil). Pure. Raises ValueError if < 0."""
        if image_bytes < 0:
            raise ValueError(f"image_bytes must be non-negative, got {image_bytes}")
        return -(-image_bytes // self.slab_bytes)

    def is_free(self, slab: SlabId) -> bool:
        """Whether ``slab`` is free. Pure. Raises ValueError for an id outside the pool."""
        self._check_id(slab)
        return self._position[slab] is not None

    def peek_free(self, count: int) -> list[SlabId] | None:
        """The ids an allocation of ``count`` slabs would take, in order; None when fewer are free.

        Pure and deterministic: ``take(peek_free(k))`` takes exactly these. Raises ValueError if count < 0.
        """
        if count < 0:
            raise ValueError(f"count must be non-negative, got {count}")
        if count > len(self._free_stack):
            return None
        if count == 0:
            return []
        return [SlabId(slab) for slab in reversed(self._free_stack[-count:])]

    def take(self, slabs: Iterable[SlabId]) -> None:
        """Mark exactly ``slabs`` used. Mutates. All-or-nothing.

        Raises ValueError (and changes nothing) when an id is outside the pool, not free, or repeated.
        """
        wanted = list(slabs)
        if len(wanted) > 1:
            self._require_distinct(wanted, "take")
        position, count = self._position, self.num_slabs
        for slab in wanted:
            if not 0 <= slab < count:
                self._check_id(slab)  # raises
            if position[slab] is None:
                raise ValueError(f"slab {slab} is not free")
        stack = self._free_stack
        for slab in wanted:  # swap-remove: the top of the stack takes the slab's place
            top = stack.pop()
            if top != slab:
                where = position[slab]
                stack[where] = top  # type: ignore[index]  # free => positioned
                position[top] = where
            position[slab] = None

    def release(self, slabs: Iterable[SlabId]) -> None:
        """Return ``slabs`` to the free stack; the last one given is reused first. Mutates. All-or-nothing.

        Raises ValueError (and changes nothing) when an id is outside the pool, already free (double
        free) or repeated.
        """
        returned = list(slabs)
        if len(returned) > 1:
            self._require_distinct(returned, "release")
        position, count = self._position, self.num_slabs
        for slab in returned:
            if not 0 <= slab < count:
                self._check_id(slab)  # raises
            if position[slab] is not None:
                raise ValueError(f"slab {slab} is already free (double free)")
        stack = self._free_stack
        for slab in returned:
            position[slab] = len(stack)
            stack.append(slab)

    def free_slabs(self) -> list[SlabId]:
        """Every free slab id in allocation order (next to be taken first). Pure; O(num_free)."""
        return [SlabId(slab) for slab in reversed(self._free_stack)]

    def free_slabs_slice(self, part: int, parts: int) -> list[int]:
        """``free_slabs()[part::parts]`` without building the whole list (one C-level slice of the
        stack; the checkpoint digest reads a slice of millions of free slabs). Pure."""
        stack = self._free_stack
        return stack[len(stack) - 1 - part :: -parts] if part < len(stack) else []

    def _check_id(self, slab: int) -> None:
        if not 0 <= slab < self.num_slabs:
            raise ValueError(f"slab {slab} outside the pool [0, {self.num_slabs})")

    @staticmethod
    def _require_distinct(slabs: list[SlabId], operation: str) -> None:
        if len(set(slabs)) != len(slabs):
            raise ValueError(f"{operation}: repeated slab ids in {slabs}")
