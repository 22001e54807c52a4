"""The gated delta rule: chunked (prefill) and recurrent (decode) forms, both in fp32.

For each value head with key `k_t`, value `v_t`, query `q_t` (q and k L2-normalised, q scaled by
`1/sqrt(key_head_dim)`), write strength `beta_t` and log-decay `g_t <= 0`, the state `S` (`[dk, dv]`) evolves
    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,    o_t = S_t^T q_t.
The chunked form processes `CHUNK` tokens at a time with a lower-triangular solve (the WY form), which is
what makes prefill matmul-bound; it is pure and returns the final state. The recurrent form steps a batch of
lanes by one token and updates their states in place in the slot plane (decode is memory-bound: the states
are the largest per-lane data a step touches, so they are read once and never copied).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from hybridcache.gpu.state_slots import SlotRun, SlotRuns

CHUNK = 64
L2_EPS = 1e-6


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x²) + eps) over the last dim."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def _prepare(query: torch.Tensor, key: torch.Tensor, value_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32, normalised, and repeated so each of the `value_heads` has its own q/k head (grouped values)."""
    group = value_heads // key.shape[-2]
    query = l2_normalize(query.float()) * (query.shape[-1] ** -0.5)
    key = l2_normalize(key.float())
    if group > 1:
        query = query.repeat_interleave(group, dim=-2)
        key = key.repeat_interleave(group, dim=-2)
    return query, key


def chunked_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    states_into: Mapping[int, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of `n` tokens. Shapes: query/key `[n, Hk, dk]`, value `[n, Hv, dv]`, log_decay/beta
    `[n, Hv]` (any dtype and strides), state `[Hv, dk, dv]` fp32 (None = zeros). Returns (output
    `[n, Hv, dv]` fp32, a strided view; final state `[Hv, dk, dv]`). Pure, except that `states_into`
    (chunk index c in [1, chunks) -> a `[Hv, dk, dv]` tensor) receives the state after the first `c * CHUNK`
    tokens: the very state a pass that stopped there returns (the recurrence runs the same products on
    the same operands), so a snapshot inside a pass needs no split of it.

    Per chunk, with `A` the strictly lower `beta_i k_i.k_j` decayed by `exp(cum_i - cum_j)`, the WY form
    needs `T = (I + A)^-1`; it is applied as `T diag(beta)` to the values and to the keys decayed to the
    chunk start, so no `[chunk, d]` operand is scaled twice. The chunk-to-chunk recurrence runs only the two
    products the next state needs; the outputs of every chunk are then two large batched products.
    """
    value_heads, key_dim, value_dim = value.shape[1], key.shape[-1], value.shape[-1]
    group = value_heads // key.shape[-2]
    chunks = -(-value.shape[0] // CHUNK)
    q = _heads_first(query, _inverse_norm(query, key_dim**-0.5), chunks)
    k = _heads_first(key, _inverse_norm(key), chunks)
    if group > 1:
        q = q.repeat_interleave(group, dim=0)
        k = k.repeat_interleave(group, dim=0)
    v = _heads_first(value, None, chunks)
    b = _heads_first(beta.unsqueeze(-1), None, chunks).squeeze(-1)  # [H, chunks, CHUNK]; padding 0
    cum = _heads_first(log_decay.unsqueeze(-1), None, chunks).squeeze(-1).cumsum_(dim=-1)
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    pair_decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill_(~causal, float("-inf")).exp_()

    strict = torch.matmul(k, k.transpose(-1, -2)).mul_(pair_decay).tril_(-1).mul_(b.unsqueeze(-1))
    eye = torch.eye(CHUNK, dtype=strict.dtype, device=strict.device)
    wy = torch.linalg.solve_triangular(
        strict.add_(eye), eye.expand_as(strict), upper=False, unitriangular=True
    ).mul_(b.unsqueeze(-2))  # T diag(beta)
    corrected = torch.matmul(wy, v)  # [H, chunks, CHUNK, dv]
    decayed_keys = torch.matmul(wy.mul_(cum.exp().unsqueeze(-2)), k)  # [H, chunks, CHUNK, dk]
    intra = torch.matmul(q, k.transpose(-1, -2)).mul_(pair_decay)
    to_end = cum[..., -1:]
    k_to_end = k.mul((to_end - cum).exp_().unsqueeze(-1)).transpose(-1, -2)  # [H, chunks, dk, CHUNK]
    chunk_decay = to_end.exp().unsqueeze(-1)  # [H, chunks, 1, 1]

    s = torch.zeros(value_heads, key_dim, value_dim, device=q.device) if state is None else state.float()
    starts = torch.empty(value_heads, chunks, key_dim, value_dim, device=q.device)
    fresh = corrected  # overwritten chunk by chunk: the values not yet predicted by the state
    for c in range(chunks):
        starts[:, c] = s
        fresh[:, c] = torch.baddbmm(corrected[:, c], decayed_keys[:, c], s, alpha=-1)
        s = torch.baddbmm(s * chunk_decay[:, c], k_to_end[:, c], fresh[:, c])
    for c, into in (states_into or {}).items():
        if not 0 < c < chunks:
            raise ValueError(f"states_into: chunk {c} is not inside the pass's {chunks} chunks")
        into.copy_(starts[:, c])
    rows = value_heads * chunks
    out = torch.matmul(q.mul_(cum.exp().unsqueeze(-1)), starts).view(rows, CHUNK, value_dim)
    out.baddbmm_(intra.view(rows, CHUNK, CHUNK), fresh.view(rows, CHUNK, value_dim))
    return out.view(value_heads, chunks * CHUNK, value_dim)[:, : value.shape[0]].transpose(0, 1), s


def _inverse_norm(x: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    """fp32 `factor / sqrt(sum(x²) + eps)` over the last dim (`[..., 1]`), without an fp32 copy of x."""
    squares = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32).square_()
    inverse = squares.add_(L2_EPS).rsqrt_()
    return inverse.mul_(factor) if factor != 1.0 else inverse


def _heads_first(x: torch.Tensor, scale: torch.Tensor | None, chunks: int) -> torch.Tensor:
    """`x [n, h, d]` (times `scale [n, h, 1]`) as fp32 `[h, chunks, CHUNK, d]`, zero-padded past n: one
    pass over x, converting, scaling and transposing at once. Pure."""
    n, heads, dim = x.shape
    out = torch.empty(heads, chunks, CHUNK, dim, dtype=torch.float32, device=x.device)
    flat = out.view(heads, chunks * CHUNK, dim)
    flat[:, n:].zero_()
    target = flat[:, :n].transpose(0, 1)
    if scale is None:
        target.copy_(x)
    else:
        torch.mul(x, scale, out=target)
    return out


def recurrent_gated_delta_rule_(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    plane: torch.Tensor,
    slots: SlotRuns,
) -> torch.Tensor:
    """One token for each of `B` lanes whose fp32 states live in `plane` (`[num_slots, Hv, dk, dv]`) at
    `slots`. Shapes: query/key `[B, Hk, dk]`, value `[B, Hv, dv]`, log_decay/beta `[B, Hv]`. Returns the
    output `[B, Hv, dv]` fp32.

    Mutates the lanes' states in `plane` in place, one run of consecutive slots at a time (no gathered copy).
    """
    query, key = _prepare(query, key, value.shape[-2])
    inputs = (query, key, value.float(), log_decay.float(), beta.float())
    if slots.order is not None:
        inputs = tuple(x.index_select(0, slots.order) for x in inputs)
    outputs = [
        _step_in_place(*(x[run.lanes] for x in inputs), plane[run.first_slot : run.first_slot + _count(run)])
        for run in slots.runs
    ]
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    if slots.order is not None:
        out = torch.empty_like(out).index_copy_(0, slots.order, out)
    return out


def _count(run: SlotRun) -> int:
    return run.lanes.stop - run.lanes.start


def _step_in_place(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> torch.Tensor:
    """The recurrent rule for `R` lanes (prepared fp32 inputs) on their states `state [R, Hv, dk, dv]` (a view
    into the plane), which is updated in place. Returns the output `[R, Hv, dv]`.

    The state is read once for both `S^T q` and `S^T k`; the output is then
    `exp(g) S^T q + (q . k) delta`, which equals `S_t^T q` of the new state without reading it again.
    """
    decay = log_decay.exp().unsqueeze(-1)  # [R, Hv, 1]
    read = torch.matmul(torch.stack((query, key), dim=-2), state)  # [R, Hv, 2, dv]
    delta = (value - read[..., 1, :] * decay) * beta.unsqueeze(-1)
    out = read[..., 0, :] * decay + (query * key).sum(dim=-1, keepdim=True) * delta
    state.mul_(decay.unsqueeze(-1)).addcmul_(key.unsqueeze(-1), delta.unsqueeze(-2))
    return out
