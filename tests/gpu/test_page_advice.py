"""Page advice: weights moved onto 2 MiB pages (values kept, refusals harmless), freed slots given back."""

from __future__ import annotations

import mmap

import pytest
import torch

from hybridcache.gpu import madvise
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

    monkeypatch.setattr(madvise, "MADVISE", refuse)
    refused, moved = HugePages.refused, HugePages.collapsed_bytes
    assert collapse(0, 8 * MIB) == 0
    assert calls == [madvise.MADV_HUGEPAGE, madvise.MADV_COLLAPSE]
    assert HugePages.refused == refused + 1 and HugePages.collapsed_bytes == moved


def test_without_madvise_nothing_is_tried(monkeypatch):
    monkeypatch.setattr(madvise, "MADVISE", None)
    assert collapse(0, 8 * MIB) == 0


def test_a_released_slot_reads_zeros_and_its_neighbours_keep_their_state():
    from hybridcache.gpu.state_slots import StateShape, StateSlots

    # recurrent planes of 3 x 512 KiB: mapped memory (zeroed_memory), so each slot is whole pages
    shape = StateShape(conv_dim=64, conv_width=3, value_heads=8, key_head_dim=64, value_head_dim=256)
    slots = StateSlots([0, 1], 3, shape, torch.float32)
    for plane in slots.planes():
        plane.fill_(1.5)
    released = slots.release_pages(1)
    assert released >= 2 * 8 * 64 * 256 * 4  # at least the two recurrent planes' share of slot 1
    for plane in slots.recurrent_planes:
        assert torch.count_nonzero(plane[1]) == 0
        assert torch.all(plane[0] == 1.5) and torch.all(plane[2] == 1.5)
