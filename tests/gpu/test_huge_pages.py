"""Moving written memory onto 2 MiB pages: the arithmetic of the range, values kept, refusals harmless."""

from __future__ import annotations

import mmap

import pytest
import torch

from hybridcache.gpu import huge_pages
from hybridcache.gpu.huge_pages import HUGE_PAGE_BYTES, HugePages, aligned_middle, collapse

MIB = 1 << 20


@pytest.mark.parametrize(
    ("address", "nbytes", "expected"),
    [
        (0, 4 * MIB, (0, 4 * MIB)),
        (1, 4 * MIB, (2 * MIB, 2 * MIB)),
        (2 * MIB - 1, 2 * MIB + 1, (2 * MIB, 2 * MIB)),
        (3 * MIB, 2 * MIB, (4 * MIB, 0)),  # no whole huge page inside
        (5, 10, (2 * MIB, 0)),
    ],
)
def test_aligned_middle_keeps_to_the_range(address, nbytes, expected):
    start, length = aligned_middle(address, nbytes)
    assert (start, length) == expected
    if length:
        assert start % HUGE_PAGE_BYTES == 0 and address <= start and start + length <= address + nbytes


def test_collapse_keeps_every_value():
    region = mmap.mmap(-1, 8 * MIB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    data = torch.frombuffer(region, dtype=torch.int32)
    data.copy_(torch.arange(data.numel(), dtype=torch.int32))
    before = HugePages.collapsed_bytes
    moved = collapse(data.data_ptr() + 12345, data.numel() * 4 - 12345)
    assert moved % HUGE_PAGE_BYTES == 0 and moved <= 6 * MIB
    assert HugePages.collapsed_bytes - before == moved
    assert torch.equal(data, torch.arange(data.numel(), dtype=torch.int32))
    del data
    region.close()


def test_a_refusal_changes_nothing(monkeypatch):
    calls = []

    def refuse(start, length, advice):
        calls.append(advice)
        return -1

    monkeypatch.setattr(huge_pages, "_MADVISE", refuse)
    refused, moved = HugePages.refused, HugePages.collapsed_bytes
    assert collapse(0, 8 * MIB) == 0
    assert calls == [huge_pages.MADV_HUGEPAGE, huge_pages.MADV_COLLAPSE]
    assert HugePages.refused == refused + 1 and HugePages.collapsed_bytes == moved


def test_without_madvise_nothing_is_tried(monkeypatch):
    monkeypatch.setattr(huge_pages, "_MADVISE", None)
    assert collapse(0, 8 * MIB) == 0
