"""The Gated DeltaNet building blocks against their plain definitions: the token-major causal conv against
torch's depthwise conv1d, and the chunked delta rule against the token-by-token recurrence, for lengths
around the chunk size and shorter than the conv kernel, with and without a carried-in state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.gpu.model.delta_rule import CHUNK, L2_EPS, chunked_gated_delta_rule
from hybridcache.gpu.model.gated_deltanet import causal_conv

CHANNELS, KERNEL = 24, 4


def conv1d_reference(inputs: torch.Tensor, past: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    window = torch.cat((past, inputs)).transpose(0, 1).unsqueeze(0)  # [1, C, K-1+n]
    return F.silu(F.conv1d(window, weight.unsqueeze(1), groups=weight.shape[0]))[0].transpose(0, 1)


@pytest.mark.parametrize("count", [1, 2, 3, 5, 64, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_conv_matches_depthwise_conv1d_and_keeps_the_last_inputs(count: int, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(count)
    inputs = torch.randn(count, CHANNELS, generator=generator).to(dtype)
    past = torch.randn(KERNEL - 1, CHANNELS, generator=generator).to(dtype)
    weight = torch.randn(CHANNELS, KERNEL, generator=generator).to(dtype)

    out, tail = causal_conv(inputs, past, weight)

    expected = conv1d_reference(inputs.float(), past.float(), weight.float()).to(dtype)
    assert out.dtype == dtype and out.shape == (count, CHANNELS)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.float(), expected.float(), rtol=tolerance, atol=tolerance)
    assert torch.equal(tail, torch.cat((past, inputs))[-(KERNEL - 1) :])


def recurrent_reference(q, k, v, g, beta, state):
    """The defining recurrence, one token at a time, in float64."""
    q = q.double() / torch.sqrt((q.double() ** 2).sum(-1, keepdim=True) + L2_EPS) * q.shape[-1] ** -0.5
    k = k.double() / torch.sqrt((k.double() ** 2).sum(-1, keepdim=True) + L2_EPS)
    s = state.double().clone()
    outputs = []
    for t in range(v.shape[0]):
        s = s * torch.exp(g[t].double())[:, None, None]
        predicted = torch.einsum("hkv,hk->hv", s, k[t])
        delta = (v[t].double() - predicted) * beta[t].double()[:, None]
        s = s + torch.einsum("hk,hv->hkv", k[t], delta)
        outputs.append(torch.einsum("hkv,hk->hv", s, q[t]))
    return torch.stack(outputs), s


@pytest.mark.parametrize("count", [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7])
@pytest.mark.parametrize("carried_state", [False, True])
def test_chunked_rule_equals_the_token_by_token_recurrence(count: int, carried_state: bool):
    generator = torch.Generator().manual_seed(count)
    heads, key_dim, value_dim = 3, 16, 8
    q = torch.randn(count, heads, key_dim, generator=generator)
    k = torch.randn(count, heads, key_dim, generator=generator)
    v = torch.randn(count, heads, value_dim, generator=generator)
    g = -torch.rand(count, heads, generator=generator)
    beta = torch.rand(count, heads, generator=generator)
    state = torch.randn(heads, key_dim, value_dim, generator=generator) if carried_state else None

    out, final = chunked_gated_delta_rule(q, k, v, g, beta, state)

    start = state if state is not None else torch.zeros(heads, key_dim, value_dim)
    expected_out, expected_final = recurrent_reference(q, k, v, g, beta, start)
    torch.testing.assert_close(out.double(), expected_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final.double(), expected_final, rtol=1e-4, atol=1e-5)


def test_grouped_value_heads_share_their_key_head():
    generator = torch.Generator().manual_seed(7)
    count, key_heads, group, key_dim, value_dim = CHUNK + 5, 2, 3, 16, 8
    q = torch.randn(count, key_heads, key_dim, generator=generator)
    k = torch.randn(count, key_heads, key_dim, generator=generator)
    v = torch.randn(count, key_heads * group, value_dim, generator=generator)
    g = -torch.rand(count, key_heads * group, generator=generator)
    beta = torch.rand(count, key_heads * group, generator=generator)

    out, final = chunked_gated_delta_rule(q, k, v, g, beta, None)

    repeated = (q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1))
    expected_out, expected_final = recurrent_reference(
        *repeated, v, g, beta, torch.zeros(key_heads * group, key_dim, value_dim)
    )
    torch.testing.assert_close(out.double(), expected_out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final.double(), expected_final, rtol=1e-4, atol=1e-5)
