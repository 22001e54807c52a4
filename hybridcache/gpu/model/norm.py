"""RMSNorm variants of Qwen3.5. Pure functions; nothing here mutates its inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: `x̂ · (1 + w)` computed in fp32, cast back to x's dtype.

    `scale` is the precomputed fp32 `1 + w` (see `norm_scale`).
    """
    # torch.rms_norm computes exactly x * rsqrt(mean(x²) + eps) * scale, in fewer dispatched ops
    return torch.rms_norm(x.float(), scale.shape, scale, eps).to(x.dtype)


def norm_scale(weight: torch.Tensor) -> torch.Tensor:
    """The fp32 `1 + w` multiplier of a zero-centred RMSNorm weight (a small copy)."""
    return 1.0 + weight.float()


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Gated DeltaNet output norm: `w · x̂` (normalised in fp32, weighted in x's dtype) · `silu(gate)`."""
    dtype = x.dtype
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return ((weight * normed) * F.silu(gate.float())).to(dtype)
