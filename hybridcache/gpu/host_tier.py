"""Host slab memory (spec §5.4): the bytes behind the slab pool, in chunks allocated on first use.

Which slab is free or owned, and where each slab lives (chunk, offset), is bookkeeping of
`cache.slab_pool.HostSlabPool`; this module only holds the bytes. A slab holds one block bundle (every
plane of a page group packed in bundle order, rounded to 4 KiB); an image spans several slabs. Chunks
are allocated on first use (pinned when the device is CUDA), so a large budget costs nothing until it
fills; the pool hands out low slab ids first, so chunks fill in order.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridcache.cache.ids import SlabId
from hybridcache.cache.slab_pool import HostSlabPool, SlabLocation
from hybridcache.gpu.slab_file import MappedSlabFile
from hybridcache.gpu.zeroed_memory import zeroed
from hybridcache.logs import get_logger

log = get_logger(__name__)


class HostAllocationError(MemoryError):
    """Host slab memory could not be allocated; the message names the size asked for."""


Allocator = Callable[[int], torch.Tensor]


def cpu_allocator(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8)


def pinned_allocator(nbytes: int) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def mapped_allocator(nbytes: int) -> torch.Tensor:
    """An anonymous private mapping, committed page by page as it is written: the fallback when the
    primary allocator refuses a chunk mid-run (pinned memory is scarce; a mapping is ordinary
    pageable memory, slower to copy from on CUDA but as correct)."""
    return zeroed((nbytes,), torch.uint8, "cpu")


class HostSlabMemory:
    """The Host tier's bytes. `chunk(i)` allocates chunk i on first use (mutates; may raise
    HostAllocationError naming the size). With `mapped_file` the chunks are mappings of that file (chunk
    i at its first slab's offset) instead of anonymous memory."""

    def __init__(
        self,
        pool: HostSlabPool,
        allocate: Allocator = cpu_allocator,
        mapped_file: MappedSlabFile | None = None,
    ) -> None:
        self.pool = pool
        self.slab_bytes = pool.slab_bytes
        self._allocate = allocate
        self.mapped_file = mapped_file
        self._chunks: list[torch.Tensor | None] = [None] * pool.num_chunks
        self.fallback_chunks = 0  # chunks the allocator refused that an anonymous mapping holds instead

    @property
    def allocated_bytes(self) -> int:
        return sum(chunk.numel() for chunk in self._chunks if chunk is not None)

    def chunk(self, index: int) -> torch.Tensor:
        """The flat uint8 tensor of chunk `index`, allocated now if it was not yet."""
        existing = self._chunks[index]
        if existing is not None:
            return existing
        nbytes = self.pool.chunk_size_bytes(index)
        try:
            if self.mapped_file is not None:
                created = self.mapped_file.map(index * self.pool.slabs_per_chunk * self.slab_bytes, nbytes)
            elif index == 0:  # at start-up (runtime.py): a refusal is the start-up error naming the size
                created = self._allocate(nbytes)
            else:
                created = self._allocate_mid_run(index, nbytes)
        except (RuntimeError, MemoryError, OSError) as error:
            raise HostAllocationError(
                f"could not allocate {nbytes >> 20} MiB of host slab memory (chunk {index}): {error}"
            ) from error
        self._chunks[index] = created
        return created

    def _allocate_mid_run(self, index: int, nbytes: int) -> torch.Tensor:
        """Chunk `index` while serving: by now its slabs are already promised to a write the cache has
        opened, so a refusal here would fail the engine; an anonymous mapping stands in instead. Raises
        what the mapping raises when that fails too."""
        try:
            return self._allocate(nbytes)
        except (RuntimeError, MemoryError) as error:
            log.warning("host slab memory: could not allocate chunk %d (%d MiB): %s; using an anonymous "
                        "mapping instead", index, nbytes >> 20, error)
        created = mapped_allocator(nbytes)
        self.fallback_chunks += 1
        return created

    def chunk_buffer(self, index: int) -> memoryview:
        """Chunk `index` as a writable byte memoryview, for reading a file straight into slab memory
        (`readinto`/`preadv`). Allocates the chunk on first use, like `chunk()`."""
        return memoryview(self.chunk(index).numpy()).cast("B")

    def slab_bytes_view(self, slab: SlabId) -> memoryview:
        """The slab's bytes as a read-only buffer (hashing; allocates its chunk if needed)."""
        return memoryview(self.slab_view(slab).numpy()).cast("B").toreadonly()

    def location(self, slab: SlabId) -> SlabLocation:
        return self.pool.location(slab)

    def slab_view(self, slab: SlabId) -> torch.Tensor:
        """The slab's bytes (a view; allocates its chunk if needed)."""
        chunk, offset = self.pool.location(slab)
        return self.chunk(chunk)[offset : offset + self.slab_bytes]
