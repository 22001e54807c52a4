"""Sizes the index is built for: device pages, state slots, host slabs (spec §5.4, §14.2)."""

from __future__ import annotations

import msgspec


class CacheGeometry(msgspec.Struct, frozen=True):
    """Fixed for the index lifetime. ``host_cache_bytes == 0`` disables the host tier."""

    num_pages: int  # device page groups (one id across every plane)
    page_bytes: int  # bytes of one page group (every plane)
    image_bytes: int  # bytes of one state image
    slab_bytes: int  # one host slab: a block bundle rounded to 4 KiB
    host_cache_bytes: int
    max_concurrency: int  # C active state slots
    device_snapshot_slots: int  # D snapshot / staging slots
    chunk_bytes: int = 4 << 30

    @property
    def image_slabs(self) -> int:
        return -(-self.image_bytes // self.slab_bytes)

    @property
    def num_slots(self) -> int:
        return self.max_concurrency + self.device_snapshot_slots

    @property
    def has_host_tier(self) -> bool:
        return self.host_cache_bytes >= self.slab_bytes
