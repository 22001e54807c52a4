"""Paged KV memory: per full-attention layer a K plane and a V plane of `[num_pages, 64, kv_heads, head_dim]`.

A *page group* is one page id across every plane: the unit the cache addresses (one 64-token block of
every full-attention layer). A lane's *block table* is the list of page ids that hold its positions in
order (position `p` lives in page `table[p // 64]` at row `p % 64`). Page states (Free / Active / Cached /
Filling) are bookkeeping in `cache/`; this module only holds the bytes and moves them.

A page bundle (the unit of host slabs) is the page's bytes of every plane packed plane by plane, in forward
order: layer L0 K, L0 V, L1 K, L1 V, ... `page_parts` names those byte ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from hybridcache.cache.ids import BLOCK_TOKENS, PageId
from hybridcache.gpu.zeroed_memory import zeroed

PAGE_TOKENS = BLOCK_TOKENS


class PagePart(NamedTuple):
    """One plane's bytes within a page bundle: `name` is e.g. `layer3.k`, `layer` the model layer index."""

    name: str
    layer: int
    offset: int
    nbytes: int


def pages_for_tokens(num_tokens: int) -> int:
    """How many pages hold `num_tokens` positions."""
    return -(-num_tokens // PAGE_TOKENS)


class KvPools:
    """The K and V planes of every full-attention layer. Mutated in place by the forward and the helpers.

    On a CPU the planes commit memory as pages are first written (`zeroed_memory`), so `num_pages` is a
    budget rather than a reservation."""

    def __init__(
        self,
        layers: Sequence[int],
        num_pages: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.layers = tuple(layers)
        self.num_pages = num_pages
        shape = (num_pages, PAGE_TOKENS, kv_heads, head_dim)
        self.k_planes = [zeroed(shape, dtype, device) for _ in self.layers]
        self.v_planes = [zeroed(shape, dtype, device) for _ in self.layers]
        plane_page_bytes = PAGE_TOKENS * kv_heads * head_dim * dtype.itemsize
        self.page_parts = _page_parts(self.layers, plane_page_bytes)
        self.page_bytes = plane_page_bytes * 2 * len(self.layers)

    @property
    def plane_page_bytes(self) -> list[int]:
        """Bytes of one page in each plane, in bundle order (for the host slab layout)."""
        return [part.nbytes for part in self.page_parts]

    def planes(self) -> list[torch.Tensor]:
        """Every plane in bundle order (K then V per layer)."""
        return [plane for pair in zip(self.k_planes, self.v_planes) for plane in pair]

    def copy_page(self, src: PageId, dst: PageId) -> None:
        """Copy page group `src` into `dst` across every plane. Mutates `dst`."""
        with torch.inference_mode():
            for plane in self.planes():
                plane[dst].copy_(plane[src])

    def export_page_into(self, page: PageId, out: torch.Tensor) -> None:
        """Pack page group `page` plane by plane into the flat uint8 tensor `out` (>= page_bytes).

        Mutates `out` only; raises ValueError when `out` is too small or not uint8.
        """
        check_byte_buffer(out, self.page_bytes)
        with torch.inference_mode():
            for part, plane in zip(self.page_parts, self.planes()):
                out[part.offset : part.offset + part.nbytes].copy_(flat_bytes(plane[page]))

    def import_page_from(self, page: PageId, data: torch.Tensor) -> None:
        """Unpack a page bundle (flat uint8, >= page_bytes) into page group `page`. Mutates the page."""
        check_byte_buffer(data, self.page_bytes)
        with torch.inference_mode():
            for part, plane in zip(self.page_parts, self.planes()):
                flat_bytes(plane[page]).copy_(data[part.offset : part.offset + part.nbytes])

    def export_pages(self, pages: Sequence[PageId]) -> bytes:
        """The bundles of `pages`, concatenated in the given order. Does not mutate."""
        out = torch.empty(self.page_bytes * len(pages), dtype=torch.uint8)
        for i, page in enumerate(pages):
            self.export_page_into(page, out[i * self.page_bytes : (i + 1) * self.page_bytes])
        return out.numpy().tobytes()

    def import_pages(self, pages: Sequence[PageId], data: bytes | bytearray | memoryview) -> None:
        """Write bundles (as `export_pages` made them) into `pages`. Mutates them; ValueError on size."""
        if len(data) != self.page_bytes * len(pages):
            raise ValueError(
                f"expected {self.page_bytes * len(pages)} bytes for {len(pages)} pages, got {len(data)}"
            )
        flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        for i, page in enumerate(pages):
            self.import_page_from(page, flat[i * self.page_bytes : (i + 1) * self.page_bytes])


def _page_parts(layers: tuple[int, ...], plane_page_bytes: int) -> list[PagePart]:
    parts = []
    for layer in layers:
        for kind in ("k", "v"):
            parts.append(
                PagePart(f"layer{layer}.{kind}", layer, len(parts) * plane_page_bytes, plane_page_bytes)
            )
    return parts


def flat_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (no copy)."""
    return tensor.reshape(-1).view(torch.uint8)


def check_byte_buffer(buffer: torch.Tensor, nbytes: int) -> None:
    if buffer.dtype != torch.uint8 or buffer.dim() != 1 or buffer.numel() < nbytes:
        raise ValueError(
            f"expected a flat uint8 tensor of at least {nbytes} bytes, got "
            f"{buffer.dtype} {tuple(buffer.shape)}"
        )
