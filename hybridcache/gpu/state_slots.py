"""State slots: one array of `num_slots` StateImages, addressed by slot index.

A StateImage is every Gated DeltaNet layer's recurrent memory for one sequence: the depthwise conv's last
`kernel - 1` inputs (`[conv_dim, kernel - 1]`, model dtype), the fp32 recurrent state
(`[value_heads, key_head_dim, value_head_dim]`) and a *pending tail*: up to `TAIL_ROWS` layer inputs
(`[TAIL_ROWS, tail_width]`, model dtype) and their count (`[1]` int32).

An image whose count is t > 0 describes position p = q + t with q a multiple of 64: its conv and recurrent
state are the ones at q, and the tail rows are the layer's inputs of the tokens [q, p). A prefill resumed
from it computes the delta rule's sub-chunk [q, q + 64) whole, as a cold pass does, which makes a snapshot
inside a block bit-exact (`GatedDeltaNet.prefill`). A count of 0 is a plain state at p. Roles (active lane /
snapshot / staging) are a map kept by the engine; here a slot is only bytes. `image_parts` lays an image out
as named byte ranges in forward order (layer by layer: conv, recurrent, tail rows, tail count), which is
what restores and write-through move part by part.

`plan_slot_runs` groups a decode batch's slots into runs of consecutive slot indices, so the decode step can
update each run's recurrent states in place through one view of the plane instead of gathering every lane's
state into a copy and scattering it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from hybridcache.cache.ids import SlotId
from hybridcache.gpu.kv_pool import check_byte_buffer, flat_bytes
from hybridcache.gpu.zeroed_memory import release_pages, zeroed


class ImagePart(NamedTuple):
    """One plane's bytes within a StateImage: `name` is e.g. `layer0.conv`, `layer` the model layer index."""

    name: str
    layer: int
    offset: int
    nbytes: int


class SlotRun(NamedTuple):
    """Slots `first_slot ..< first_slot + count` hold the states of lanes `lanes` (a range of the batch in
    slot order: positions in `SlotRuns.order`)."""

    first_slot: int
    lanes: slice


class SlotRuns(NamedTuple):
    """A decode batch's slots grouped into runs of consecutive slots.

    `index` is the int64 `[B]` slot of each lane (batch order). `order` is the permutation (int64 `[B]`)
    that sorts the lanes by slot, or None when they already are; `runs` cover the sorted lanes in order.
    """

    index: torch.Tensor
    order: torch.Tensor | None
    runs: tuple[SlotRun, ...]


def plan_slot_runs(slots: Sequence[SlotId], device: torch.device | str = "cpu") -> SlotRuns:
    """Group distinct `slots` (one per lane) into runs of consecutive slots. Pure; raises ValueError on a
    repeated slot."""
    if len(set(slots)) != len(slots):
        raise ValueError(f"decode slots must be distinct, got {list(slots)}")
    by_slot = sorted(range(len(slots)), key=lambda lane: slots[lane])
    sorted_slots = [int(slots[lane]) for lane in by_slot]
    runs: list[SlotRun] = []
    start = 0
    for end in range(1, len(sorted_slots) + 1):
        if end == len(sorted_slots) or sorted_slots[end] != sorted_slots[end - 1] + 1:
            runs.append(SlotRun(sorted_slots[start], slice(start, end)))
            start = end
    in_order = by_slot == list(range(len(slots)))
    return SlotRuns(
        index=torch.as_tensor([int(slot) for slot in slots], dtype=torch.long, device=device),
        order=None if in_order else torch.as_tensor(by_slot, dtype=torch.long, device=device),
        runs=tuple(runs),
    )


TAIL_ROWS = 63
"""Most layer inputs a pending tail holds: a block's tokens before the last one."""


class StateShape(NamedTuple):
    """The per-layer shapes of a StateImage."""

    conv_dim: int
    conv_width: int  # kernel - 1 columns of history
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    tail_width: int = 0  # a Gated DeltaNet layer's input width (the model's hidden size); 0: no tail rows


class StateSlots:
    """The state-slot array. Mutated in place by the forward and by the copy helpers below."""

    def __init__(
        self,
        layers: Sequence[int],
        num_slots: int,
        shape: StateShape,
        conv_dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        self.layers = tuple(layers)
        self.num_slots = num_slots
        self.shape = shape
        conv_shape = (num_slots, shape.conv_dim, shape.conv_width)
        rec_shape = (num_slots, shape.value_heads, shape.key_head_dim, shape.value_head_dim)
        self.conv_planes = [zeroed(conv_shape, conv_dtype, device) for _ in self.layers]
        self.recurrent_planes = [zeroed(rec_shape, torch.float32, device) for _ in self.layers]
        tail_shape = (num_slots, TAIL_ROWS if shape.tail_width else 0, shape.tail_width)
        self.tail_row_planes = [zeroed(tail_shape, conv_dtype, device) for _ in self.layers]
        self.tail_count_planes = [zeroed((num_slots, 1), torch.int32, device) for _ in self.layers]
        self.image_parts = _image_parts(self.layers, self.planes())
        self.image_bytes = sum(part.nbytes for part in self.image_parts)

    def planes(self) -> list[torch.Tensor]:
        """Every plane in image order (per layer in forward order: conv, recurrent, tail rows, tail count)."""
        per_layer = zip(self.conv_planes, self.recurrent_planes, self.tail_row_planes, self.tail_count_planes)
        return [plane for group in per_layer for plane in group]

    def tail_bytes(self) -> int:
        """Bytes of one image that hold the pending tail (rows and counts of every layer). Pure."""
        tail_parts = (".tail_rows", ".tail_count")
        return sum(part.nbytes for part in self.image_parts if part.name.endswith(tail_parts))

    def tail_tokens(self, slot: SlotId) -> int:
        """The pending tail's token count of slot `slot` (the same in every layer). Does not mutate."""
        return int(self.tail_count_planes[0][slot, 0]) if self.layers else 0

    def reset_slot(self, slot: SlotId) -> None:
        """Zero slot `slot`: the state of an empty sequence. Mutates it."""
        with torch.inference_mode():
            for plane in self.planes():
                plane[slot].zero_()

    def release_pages(self, slot: SlotId) -> int:
        """Give the memory of the free slot `slot` back to the system where it is whole pages (a CPU); the
        slot reads as zeros afterwards. Returns the bytes released."""
        return sum(release_pages(plane[slot]) for plane in self.planes())

    def copy_slot(self, src: SlotId, dst: SlotId) -> None:
        """Copy slot `src` into `dst`. Mutates `dst`."""
        with torch.inference_mode():
            for plane in self.planes():
                plane[dst].copy_(plane[src])

    def export_slot_into(self, slot: SlotId, out: torch.Tensor) -> None:
        """Pack slot `slot` plane by plane into the flat uint8 tensor `out` (>= image_bytes).

        Mutates `out` only; raises ValueError when `out` is too small or not uint8.
        """
        check_byte_buffer(out, self.image_bytes)
        with torch.inference_mode():
            for part, plane in zip(self.image_parts, self.planes()):
                out[part.offset : part.offset + part.nbytes].copy_(flat_bytes(plane[slot]))

    def import_slot_from(self, slot: SlotId, data: torch.Tensor) -> None:
        """Unpack an image (flat uint8 tensor, >= image_bytes) into slot `slot`. Mutates the slot."""
        check_byte_buffer(data, self.image_bytes)
        with torch.inference_mode():
            for part, plane in zip(self.image_parts, self.planes()):
                flat_bytes(plane[slot]).copy_(data[part.offset : part.offset + part.nbytes])

    def export_slot(self, slot: SlotId) -> bytes:
        """The image of slot `slot` as bytes. Does not mutate."""
        out = torch.empty(self.image_bytes, dtype=torch.uint8)
        self.export_slot_into(slot, out)
        return out.numpy().tobytes()

    def import_slot(self, slot: SlotId, data: bytes | bytearray | memoryview) -> None:
        """Write an image (as `export_slot` made it) into slot `slot`. Mutates it; ValueError on size."""
        if len(data) != self.image_bytes:
            raise ValueError(f"expected {self.image_bytes} image bytes, got {len(data)}")
        self.import_slot_from(slot, torch.frombuffer(bytearray(data), dtype=torch.uint8))


def _image_parts(layers: tuple[int, ...], planes: list[torch.Tensor]) -> list[ImagePart]:
    parts: list[ImagePart] = []
    offset = 0
    kinds = ("conv", "recurrent", "tail_rows", "tail_count")
    for i, plane in enumerate(planes):
        layer = layers[i // len(kinds)]
        nbytes = plane[0].numel() * plane.element_size()
        parts.append(ImagePart(f"layer{layer}.{kinds[i % len(kinds)]}", layer, offset, nbytes))
        offset += nbytes
    return parts
