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
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of `n` tokens. Shapes: query/key `[n, Hk, dk]`, value `[n, Hv, dv]`, log_decay/beta
    `[n, Hv]`,
    state `[Hv, dk, dv]` fp32 (None = zeros). Returns (output `[n, Hv, dv]` fp32, final state `[Hv, dk, dv]`).
    """
    n, value_heads, value_dim = value.shape
    query, key = _prepare(query, key, value_heads)
    pad = (-n) % CHUNK
    chunks = (n + pad) // CHUNK

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [n, H, d] -> [H, chunks, CHUNK, d]
        x = x.float().transpose(0, 1)
        if pad:
            x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.reshape(x.shape[0], chunks, CHUNK, x.shape[-1])

    q, k, v = heads_first(query), heads_first(key), heads_first(value)
    b = heads_first(beta.unsqueeze(-1))
    cum = heads_first(log_decay.unsqueeze(-1)).squeeze(-1).cumsum(dim=-1)  # [H, chunks, CHUNK]
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    pair_decay = (cum.unsqueeze(-1) - cum.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()

    k_beta = k * b
    strict = (k_beta @ k.transpose(-1, -2)) * pair_decay
    lower = strict.tril(-1) + torch.eye(CHUNK, dtype=strict.dtype, device=strict.device)
    rhs = torch.cat((v * b, k_beta * cum.exp().unsqueeze(-1)), dim=-1)
    solved = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
    corrected_values, decayed_keys = solved[..., :value_dim], solved[..., value_dim:]

    intra = (q @ k.transpose(-1, -2)) * pair_decay
    q_decayed = q * cum.exp().unsqueeze(-1)
    to_end = cum[..., -1:]
    k_to_end = (k * (to_end - cum).exp().unsqueeze(-1)).transpose(-1, -2)
    chunk_decay = to_end.exp().unsqueeze(-1)  # [H, chunks, 1, 1]

    s = torch.zeros(value_heads, k.shape[-1], value_dim, device=q.device) if state is None else state.float()
    out = torch.empty_like(corrected_values)
    for c in range(chunks):
        fresh = corrected_values[:, c] - decayed_keys[:, c] @ s
        out[:, c] = q_decayed[:, c] @ s + intra[:, c] @ fresh
        s = s * chunk_decay[:, c] + k_to_end[:, c] @ fresh
    out = out.reshape(value_heads, chunks * CHUNK, value_dim)[:, :n].transpose(0, 1)
    return out, s


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
