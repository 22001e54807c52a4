"""RMSNorm variants of Qwen3.5. Pure functions; nothing here mutates its inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridcache.gpu.model import cpu_kernels


def rms_norm(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: `x̂ · (1 + w)` computed in fp32, cast back to x's dtype.

    `scale` is the precomputed fp32 `1 + w` (see `norm_scale`).
    """
    if _kernel_applies(x, scale):
        return _rms_norm_kernel(x, scale, eps)
    # torch.rms_norm computes exactly x * rsqrt(mean(x²) + eps) * scale, in fewer dispatched ops
    return torch.rms_norm(x.float(), scale.shape, scale, eps).to(x.dtype)


def _kernel_applies(x: torch.Tensor, scale: torch.Tensor) -> bool:
    return (
        x.dtype == torch.bfloat16
        and scale.dtype == torch.float32
        and x.device.type == "cpu"
        and cpu_kernels.library() is not None
    )


def _rms_norm_kernel(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` of bf16 rows by `cpu_rms_norm.c`: one call instead of three ops (decode runs 61 norms a
    step). Used for every bf16 row on a CPU, prefill's too, so a row never depends on which path ran it."""
    x = x.contiguous()
    out = torch.empty_like(x)
    width = x.shape[-1]
    cpu_kernels.library().hc_rms_norm_bf16(
        x.data_ptr(), x.numel() // width, width, scale.contiguous().data_ptr(), eps, out.data_ptr(),
        torch.get_num_threads(),
    )  # fmt: skip
    return out


def norm_scale(weight: torch.Tensor) -> torch.Tensor:
    """The fp32 `1 + w` multiplier of a zero-centred RMSNorm weight (a small copy)."""
    return 1.0 + weight.float()


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The Gated DeltaNet output norm: `w · x̂` (normalised in fp32, weighted in x's dtype) · `silu(gate)`."""
    dtype = x.dtype
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
    return ((weight * normed) * F.silu(gate.float())).to(dtype)
