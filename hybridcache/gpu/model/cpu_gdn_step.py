"""Decode's Gated DeltaNet layer between its two projections, by a kernel of our own (`cpu_gdn_step.c`).

The torch form (gates, conv step, SiLU, split, L2 norms, the recurrent delta rule, the gated output norm)
dispatches about thirty small ops per layer and passes over each lane's fp32 state three times. The
kernel does the same arithmetic in one call, with one pass per state, the conv vectorized and split over
the threads. It applies on a CPU where the kernels library is in use (`cpu_kernels.py`) and the
activations, conv states and small weights are bf16; anything else keeps the torch form.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hybridcache.gpu.model import cpu_kernels
from hybridcache.gpu.model.delta_rule import L2_EPS

if TYPE_CHECKING:
    from hybridcache.gpu.model.gated_deltanet import GatedDeltaNet


def applies(layer: GatedDeltaNet, projected: torch.Tensor, conv_plane: torch.Tensor) -> bool:
    """Whether `step` runs for this layer and these tensors: CPU, bf16 activations, conv state and weights."""
    bf16 = torch.bfloat16
    return (
        projected.device.type == "cpu"
        and projected.dtype == conv_plane.dtype == layer.conv_weight.dtype == bf16
        and layer.dt_bias.dtype == layer.norm_weight.dtype == bf16
        and layer.neg_a.dtype == torch.float32
        and all(w.is_contiguous() for w in (layer.conv_weight, layer.dt_bias, layer.norm_weight, layer.neg_a))
        and cpu_kernels.library() is not None
    )


def step(
    layer: GatedDeltaNet,
    projected: torch.Tensor,
    conv_plane: torch.Tensor,
    recurrent_plane: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """The gated, normed delta-rule output `[B, Hv * dv]` bf16 (the output projection's input) for
    `projected [B, conv_dim + Hv dv + 2 Hv]` (the lanes' input projection: qkv, z, b, a).

    Mutates the lanes' rows of `conv_plane [slots, conv_dim, kernel-1]` and `recurrent_plane [slots, Hv,
    dk, dv]` (lane b's at `slots[b]`) in place.
    """
    lanes = projected.shape[0]
    value_heads, _, value_head_dim = recurrent_plane.shape[1:]
    conv_dim = conv_plane.shape[1]
    if projected.stride(-1) != 1:
        projected = projected.contiguous()
    for plane in (conv_plane, recurrent_plane):
        if not plane.is_contiguous():
            raise ValueError("state planes must be contiguous")
    slots = slots.to(torch.int64).contiguous()
    scratch = torch.empty(lanes, conv_dim, dtype=torch.float32)
    normed = torch.empty(lanes, value_heads * value_head_dim, dtype=torch.bfloat16)
    cpu_kernels.library().hc_gdn_decode_step(
        projected.data_ptr(), projected.stride(0), conv_plane.data_ptr(), layer.conv_weight.data_ptr(),
        layer.neg_a.data_ptr(), layer.dt_bias.data_ptr(), layer.norm_weight.data_ptr(),
        recurrent_plane.data_ptr(), slots.data_ptr(), scratch.data_ptr(), normed.data_ptr(), lanes,
        layer.key_heads, value_heads, layer.key_head_dim, value_head_dim, layer.conv_weight.shape[-1],
        L2_EPS, layer.eps, torch.get_num_threads(),
    )  # fmt: skip
    return normed
