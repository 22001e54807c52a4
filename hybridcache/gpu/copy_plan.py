"""Planning of page and image transfers between device planes and host slabs (spec §5.4, §11.2).

Pure arithmetic, no tensors: the backends execute the plans. A device plane holds page `p` at byte
`p * page_plane_bytes`; a host slab record lives at a (chunk, offset) location. A *run* joins consecutive
device pages whose slab records share a chunk and advance by one constant pitch no larger than the
device's maximum copy pitch, so one strided 2-D copy per plane moves the whole run. Runs are split
explicitly at chunk boundaries and at the pitch limit: any two records could otherwise form a run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from hybridcache.cache.ids import PageId, SlabId
from hybridcache.cache.slab_pool import SlabLocation

DEFAULT_MAX_COPY_PITCH = 1 << 31  # bytes; CUDA's cudaMemcpy2D pitch limit is queried on a GPU


class PageRun(NamedTuple):
    """`count` pages from `first_page` (consecutive) to slab records from `first_slab` (pitch apart)."""

    first_page: PageId
    chunk: int
    host_offset: int  # byte offset of the first slab record in its chunk
    host_pitch: int  # bytes between consecutive records (0 when count == 1)
    count: int


class ImageSegment(NamedTuple):
    """A contiguous piece of one image part that lands in one slab."""

    part_index: int
    part_offset: int  # byte offset inside the part
    slab: SlabId
    slab_offset: int  # byte offset inside the slab
    nbytes: int


def plan_page_runs(
    pairs: Sequence[tuple[PageId, SlabId]],
    locate: Callable[[SlabId], SlabLocation],
    max_pitch: int = DEFAULT_MAX_COPY_PITCH,
) -> list[PageRun]:
    """Coalesce (device page, host slab) pairs into strided runs. Pure.

    Pairs are sorted by page first, so the caller may pass them in any order. A run continues while the
    next page is the previous page + 1, its slab lies in the same chunk, and the slab offset advances by
    the run's pitch (fixed by its first two records), which must be positive and at most `max_pitch`.
    """
    runs: list[PageRun] = []
    first_page = chunk = offset = pitch = count = last_page = last_offset = -1
    for page, slab in sorted(pairs):
        location = locate(slab)
        if count > 0 and page == last_page + 1 and location.chunk == chunk:
            step = location.offset - last_offset
            if count == 1 and 0 < step <= max_pitch:
                pitch = step
            if step == pitch and pitch > 0:
                count += 1
                last_page, last_offset = page, location.offset
                continue
        if count > 0:
            runs.append(PageRun(PageId(first_page), chunk, offset, pitch if count > 1 else 0, count))
        first_page, chunk, offset, pitch, count = page, location.chunk, location.offset, -1, 1
        last_page, last_offset = page, location.offset
    if count > 0:
        runs.append(PageRun(PageId(first_page), chunk, offset, pitch if count > 1 else 0, count))
    return runs


def plan_image_segments(
    part_sizes: Sequence[int], slabs: Sequence[SlabId], slab_bytes: int
) -> list[ImageSegment]:
    """Spread an image's parts (packed back to back, in order) over `slabs`. Pure.

    The image's packed byte `o` lives in `slabs[o // slab_bytes]` at offset `o % slab_bytes`. Raises
    ValueError when the slabs cannot hold the image.
    """
    total = sum(part_sizes)
    if total > len(slabs) * slab_bytes:
        raise ValueError(f"{len(slabs)} slabs of {slab_bytes} B cannot hold an image of {total} B")
    segments: list[ImageSegment] = []
    packed = 0
    for index, size in enumerate(part_sizes):
        done = 0
        while done < size:
            slab_index, slab_offset = divmod(packed + done, slab_bytes)
            nbytes = min(size - done, slab_bytes - slab_offset)
            segments.append(ImageSegment(index, done, slabs[slab_index], slab_offset, nbytes))
            done += nbytes
        packed += size
    return segments
