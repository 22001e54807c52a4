"""Gated DeltaNet: projections, depthwise causal conv with its state, the gated delta rule, gated RMSNorm.

The layer's memory lives in a state slot: `conv` holds the last `kernel - 1` pre-conv inputs
(`[conv_dim, kernel - 1]`) and `recurrent` the fp32 delta-rule state (`[Hv, dk, dv]`). Prefill reads a
slot's state (or zeros for a fresh sequence) and writes the new state back in place; decode does the same
for a batch of slots at once.

`capturing_states` also copies, during one prefill pass, the state at chosen positions inside the pass
into other slots (snapshots the tap planner places inside a pass): at a 64-token sub-chunk boundary the
state a pass split there would have left, elsewhere the state at the boundary below plus the inputs since
(a pending tail), taken without splitting the pass. The request travels beside the forward (a thread-local
set for the pass on the thread that runs it), so the model's call signature is unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import NamedTuple

import torch
import torch.nn.functional as F

from hybridcache.cache.ids import SlotId
from hybridcache.gpu.model import cpu_gdn_step
from hybridcache.gpu.model.delta_rule import CHUNK, chunked_gated_delta_rule, recurrent_gated_delta_rule_
from hybridcache.gpu.model.linear import linear
from hybridcache.gpu.model.norm import gated_rms_norm
from hybridcache.gpu.model.row_tiles import Product, lane_aligned, tiled_linear
from hybridcache.gpu.state_slots import SlotRuns, StateSlots


class _Capture(NamedTuple):
    offset: int  # tokens into the pass, positive
    conv: torch.Tensor  # the destination slot's views of this layer
    recurrent: torch.Tensor
    tail_rows: torch.Tensor
    tail_count: torch.Tensor


_pending = threading.local()  # .by_state: data_ptr of the lane slot's recurrent view -> [_Capture]


@contextmanager
def capturing_states(states: StateSlots, lane_slot: SlotId, targets: Mapping[int, SlotId]) -> Iterator[None]:
    """Within the block, a prefill pass of the lane in `lane_slot` (run on this thread) also writes the
    state after its first `offset` tokens into slot `targets[offset]`, for every Gated DeltaNet layer.
    Offsets must be positive and shorter than the pass; raises ValueError for one that is not positive.

    The state is written as the pass's sub-chunk structure has it (`StateSlots`): the conv and recurrent
    state at the sub-chunk boundary at or below the offset plus the layer inputs from there on as a pending
    tail, so a capture anywhere inside a pass that starts on a block boundary resumes bit-exactly."""
    if any(offset <= 0 for offset in targets):
        raise ValueError(f"capture offsets must be positive, got {sorted(targets)}")
    planes = zip(
        states.conv_planes, states.recurrent_planes, states.tail_row_planes, states.tail_count_planes
    )
    by_state = {
        recurrent[lane_slot].data_ptr(): [
            _Capture(offset, conv[slot], recurrent[slot], rows[slot], count[slot])
            for offset, slot in sorted(targets.items())
        ]
        for conv, recurrent, rows, count in planes
    }
    _pending.by_state = by_state if targets else None
    try:
        yield
    finally:
        _pending.by_state = None


def _captures_for(recurrent_state: torch.Tensor) -> list[_Capture]:
    by_state = getattr(_pending, "by_state", None)
    return by_state.get(recurrent_state.data_ptr(), []) if by_state else []


class GatedDeltaNet(NamedTuple):
    """One Gated DeltaNet layer's weights (views into the checkpoint, except the small fp32 `neg_a`)."""

    in_proj: torch.Tensor  # [conv_dim + value_dim + 2 * Hv, hidden]: the qkv, z, b and a rows in that order
    conv_weight: torch.Tensor  # [conv_dim, kernel]
    neg_a: torch.Tensor  # fp32 -exp(A_log), [Hv]
    dt_bias: torch.Tensor  # [Hv]
    norm_weight: torch.Tensor  # [dv]
    out_proj: torch.Tensor  # [hidden, value_dim]
    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    eps: float

    def _project(self, x: torch.Tensor, product: Product = linear) -> tuple[torch.Tensor, ...]:
        """(mixed qkv [t, conv_dim], z [t, Hv, dv], beta [t, Hv], log-decay [t, Hv] fp32), each a view
        into one product: the four projections are one matmul call."""
        value_dim = self.value_heads * self.value_head_dim
        conv_dim = 2 * self.key_heads * self.key_head_dim + value_dim
        sizes = (conv_dim, value_dim, self.value_heads, self.value_heads)
        mixed, z, b, a = product(x, self.in_proj).split(sizes, dim=-1)
        z = z.view(x.shape[0], self.value_heads, self.value_head_dim)
        # [t, Hv] is narrow: lane-aligned, a token's decay and beta do not depend on its row index
        log_decay = self.neg_a * lane_aligned(F.softplus, a.float() + self.dt_bias)
        return mixed, z, lane_aligned(torch.sigmoid, b), log_decay

    def _split(self, conv_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split `[t, conv_dim]` into q `[t, Hk, dk]`, k `[t, Hk, dk]`, v `[t, Hv, dv]`."""
        tokens = conv_out.shape[0]
        key_dim = self.key_heads * self.key_head_dim
        q, k, v = conv_out.split((key_dim, key_dim, self.value_heads * self.value_head_dim), dim=-1)
        return (
            q.reshape(tokens, self.key_heads, self.key_head_dim),
            k.reshape(tokens, self.key_heads, self.key_head_dim),
            v.reshape(tokens, self.value_heads, self.value_head_dim),
        )

    def _output(
        self, core: torch.Tensor, z: torch.Tensor, dtype: torch.dtype, product: Product = linear
    ) -> torch.Tensor:
        normed = gated_rms_norm(core.to(dtype), z, self.norm_weight, self.eps)
        return product(normed.reshape(core.shape[0], -1), self.out_proj)

    def prefill(
        self,
        x: torch.Tensor,
        conv_state: torch.Tensor,
        recurrent_state: torch.Tensor,
        tail_rows: torch.Tensor,
        tail_count: torch.Tensor,
        fresh: bool,
    ) -> torch.Tensor:
        """`x [n, hidden]` of one lane -> `[n, hidden]`.

        Mutates the slot's views in place: `conv_state [conv_dim, kernel-1]`, `recurrent_state [Hv, dk, dv]`
        and the pending tail (`tail_rows [TAIL_ROWS, hidden]`, `tail_count [1]`, see `StateSlots`), which
        leaves as a plain state at the pass's end (count 0). `fresh` means the sequence starts here and the
        slot's previous contents are ignored.

        A pending tail of t inputs is computed again in front of the pass: the pass runs as one that started
        t tokens earlier, on the block boundary, and the first t rows are dropped. Every row then comes out
        as in a pass that started earlier (`row_tiles`; the delta rule's sub-chunks start at the boundary).
        """
        captures = _captures_for(recurrent_state)
        pending = 0 if fresh else int(tail_count[0])
        if pending:
            x = torch.cat((tail_rows[:pending], x))
        mixed, z, beta, log_decay = self._project(x, tiled_linear)
        history = torch.zeros_like(conv_state) if fresh else conv_state
        start_state = torch.zeros_like(recurrent_state) if fresh else recurrent_state
        into: dict[int, torch.Tensor] = {}
        same_boundary: list[tuple[torch.Tensor, torch.Tensor]] = []
        for capture in captures:  # before the slot's state is overwritten below
            end = pending + capture.offset
            boundary = end - end % CHUNK
            capture.conv.copy_(_conv_history(mixed, history, boundary))
            capture.tail_rows[: end - boundary].copy_(x[boundary:end])
            capture.tail_count.fill_(end - boundary)
            if boundary == 0:
                capture.recurrent.copy_(start_state)
            elif boundary // CHUNK in into:
                same_boundary.append((capture.recurrent, into[boundary // CHUNK]))
            else:
                into[boundary // CHUNK] = capture.recurrent
        conv_out, tail = causal_conv(mixed, history.transpose(0, 1), self.conv_weight)
        conv_state.copy_(tail.transpose(0, 1))
        q, k, v = self._split(conv_out.float())  # the delta rule is fp32; one conversion for all three
        core, final = chunked_gated_delta_rule(
            q, k, v, log_decay, beta, None if fresh else recurrent_state, into or None
        )
        for target, source in same_boundary:
            target.copy_(source)
        recurrent_state.copy_(final)
        tail_count.zero_()
        return self._output(core[pending:], z[pending:], x.dtype, tiled_linear)

    def decode(
        self, x: torch.Tensor, conv_plane: torch.Tensor, recurrent_plane: torch.Tensor, slots: SlotRuns
    ) -> torch.Tensor:
        """`x [B, hidden]`, one token per lane -> `[B, hidden]`.

        Reads the states of `slots` (lane b's slot is `slots.index[b]`) from the planes and writes the new
        states back in place.
        """
        if cpu_gdn_step.applies(self, x, conv_plane):
            projected = linear(x, self.in_proj)
            normed = cpu_gdn_step.step(self, projected, conv_plane, recurrent_plane, slots.index)
            return linear(normed, self.out_proj)
        mixed, z, beta, log_decay = self._project(x)
        conv_out = self._conv_step(mixed, conv_plane, slots.index)
        q, k, v = self._split(conv_out)
        core = recurrent_gated_delta_rule_(q, k, v, log_decay, beta, recurrent_plane, slots)
        return self._output(core, z, x.dtype)

    def _conv_step(self, mixed: torch.Tensor, conv_plane: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """One conv output column per lane (`[B, conv_dim]`, after SiLU); shifts `mixed` into the lanes'
        conv states. Mutates `conv_plane` at `slots`."""
        history = conv_plane.index_select(0, slots)
        window = torch.cat((history, mixed.unsqueeze(-1).to(conv_plane.dtype)), dim=-1)  # [B, C, K]
        conv_plane.index_copy_(0, slots, window[:, :, 1:])
        return F.silu((window * self.conv_weight).sum(dim=-1))  # one output column: a dot per channel


def _conv_history(mixed: torch.Tensor, history: torch.Tensor, offset: int) -> torch.Tensor:
    """The conv state after the first `offset` inputs of a pass (`[conv_dim, kernel - 1]`): the last
    `kernel - 1` inputs before it, from the pass (`mixed [n, C]`) and the slot's `history` before it."""
    width = history.shape[1]
    if offset >= width:
        return mixed[offset - width : offset].transpose(0, 1)
    return torch.cat((history[:, offset:], mixed[:offset].transpose(0, 1).to(history.dtype)), dim=1)


def causal_conv(
    inputs: torch.Tensor, past: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise causal conv of a chunk, then SiLU: `inputs [n, C]` after the `past [K-1, C]` inputs,
    `weight [C, K]` -> (`silu(conv)` `[n, C]` in inputs' dtype, the last `K-1` inputs `[K-1, C]`). Pure.

    Computed token-major (the layout of the projections around it, so nothing is transposed) as K shifted
    multiply-adds accumulated in fp32 and rounded once, as a conv kernel does.
    """
    count, kernel = inputs.shape[0], weight.shape[1]
    taps, wide, wide_past = weight.float(), inputs.float(), past.float()  # same-dtype products are fast
    acc = wide * taps[:, kernel - 1]
    for shift in range(1, kernel):
        tap = taps[:, kernel - 1 - shift]
        if shift < count:
            acc[shift:].addcmul_(wide[: count - shift], tap)
        rows = min(shift, count)
        acc[:rows].addcmul_(wide_past[kernel - 1 - shift : kernel - 1 - shift + rows], tap)
    if count >= kernel - 1:
        tail = inputs[count - (kernel - 1) :]
    else:
        tail = torch.cat((past[count:], inputs.to(past.dtype)))
    return F.silu(acc.to(inputs.dtype)), tail
