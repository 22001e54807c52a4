"""The gated delta rule: chunked (prefill) and recurrent (decode) forms, both in fp32.

For each value head with key `k_t`, value `v_t`, query `q_t` (q and k L2-normalised, q scaled by
`1/sqrt(key_head_dim)`), write strength `beta_t` and log-decay `g_t <= 0`, the state `S` (`[dk, dv]`) evolves
    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,    o_t = S_t^T q_t.
The chunked form processes `CHUNK` tokens at a time with a lower-triangular solve (the WY form), which is
what makes prefill matmul-bound; the recurrent form steps a batch of lanes by one token. Pure functions:
inputs are not mutated; the new state is returned.
"""

from __future__ import annotations

import torch

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


def recurrent_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of `B` lanes. Shapes: query/key `[B, Hk, dk]`, value `[B, Hv, dv]`, log_decay/beta
    `[B, Hv]`, state `[B, Hv, dk, dv]` fp32. Returns (output `[B, Hv, dv]` fp32, new state).
    """
    query, key = _prepare(query, key, value.shape[-2])
    decayed = state * log_decay.float().exp()[..., None, None]
    predicted = (key.unsqueeze(-2) @ decayed).squeeze(-2)  # [B, Hv, dv]
    delta = (value.float() - predicted) * beta.float().unsqueeze(-1)
    new_state = decayed + key.unsqueeze(-1) * delta.unsqueeze(-2)
    out = (query.unsqueeze(-2) @ new_state).squeeze(-2)
    return out, new_state
