"""Decode's Gated DeltaNet step after the input projection, by a kernel of our own (`cpu_gdn_step.c`).

The torch form (conv step, SiLU, split, L2 norms, the recurrent delta rule) dispatches about twenty small
ops per layer and passes over each lane's fp32 state three times: 0.45 ms per layer for one lane on the
`small` shapes, about 8 ms of a 100 ms decode step. The kernel does the same arithmetic in one pass per
state. It applies on a CPU where the kernels library is in use (`cpu_kernels.py`) and the activations and
conv states are bf16; anything else keeps the torch form.
"""

from __future__ import annotations

import torch

from hybridcache.gpu.model import cpu_kernels
from hybridcache.gpu.model.delta_rule import L2_EPS


def applies(mixed: torch.Tensor, conv_plane: torch.Tensor, conv_weight: torch.Tensor) -> bool:
    """Whether `step` runs for these tensors: CPU, bf16 activations, conv state and conv weight."""
    return (
        mixed.device.type == "cpu"
        and mixed.dtype == conv_plane.dtype == conv_weight.dtype == torch.bfloat16
        and cpu_kernels.library() is not None
    )


def step(
    mixed: torch.Tensor,
    conv_plane: torch.Tensor,
    conv_weight: torch.Tensor,
    recurrent_plane: torch.Tensor,
    slots: torch.Tensor,
    log_decay: torch.Tensor,
    beta: torch.Tensor,
    key_heads: int,
    key_head_dim: int,
) -> torch.Tensor:
    """The delta-rule output `[B, Hv, dv]` fp32 for `mixed [B, conv_dim]` (the lanes' qkv before the conv).

    Mutates the lanes' rows of `conv_plane [slots, conv_dim, kernel-1]` and `recurrent_plane [slots, Hv,
    dk, dv]` (lane b's at `slots[b]`) in place. log_decay and beta: `[B, Hv]`.
    """
    lanes, conv_dim = mixed.shape
    value_heads, _, value_head_dim = recurrent_plane.shape[1:]
    if mixed.stride(-1) != 1:
        mixed = mixed.contiguous()
    conv_weight = conv_weight.contiguous()
    log_decay = log_decay.float().contiguous()
    beta = beta.float().contiguous()
    slots = slots.to(torch.int64).contiguous()
    scratch = torch.empty(lanes, conv_dim, dtype=torch.float32)
    out = torch.empty(lanes, value_heads, value_head_dim, dtype=torch.float32)
    for plane in (conv_plane, recurrent_plane):
        if not plane.is_contiguous():
            raise ValueError("state planes must be contiguous")
    cpu_kernels.library().hc_gdn_decode_step(
        mixed.data_ptr(), mixed.stride(0), conv_plane.data_ptr(), conv_weight.data_ptr(),
        recurrent_plane.data_ptr(), slots.data_ptr(), log_decay.data_ptr(), beta.data_ptr(),
        scratch.data_ptr(), out.data_ptr(), lanes, key_heads, value_heads, key_head_dim, value_head_dim,
        conv_weight.shape[-1], L2_EPS, torch.get_num_threads(),
    )  # fmt: skip
    return out
