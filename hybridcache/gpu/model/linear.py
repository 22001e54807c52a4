"""Linear layers whose weights may be prepacked for the CPU's matmul library (oneDNN).

On a CPU, oneDNN's bf16 matmul repacks a plain `[out, in]` weight into its blocked layout on every call. For
prefill that is a small cost next to the arithmetic, but decode multiplies a few rows by every weight of the
model, so the per-call repacking roughly halves the speed at which weights stream from memory. `pack_weight`
does the repacking once, at load time; `linear` computes the same product from either form (the packed and
plain products are the same kernel on the same numbers: bit-identical results).

Packing applies only where it pays and exists: a CPU, bf16, and a torch build whose oneDNN has the internal
reorder op and bf16 support on this CPU. Everywhere else (fp32, fp16, CUDA) weights stay plain tensors and
`linear` is `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

DECODE_ROWS_HINT = 4
"""The batch size oneDNN is told to expect when it chooses a packed layout (decode's; any size works)."""


def can_pack(dtype: torch.dtype, device: torch.device | str) -> bool:
    """Whether `pack_weight` applies to weights of `dtype` on `device`. Pure."""
    return (
        torch.device(device).type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and _cpu_has_bf16_matmul()
    )


def _cpu_has_bf16_matmul() -> bool:
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A packed copy of the plain `[out, in]` weight (an opaque oneDNN tensor, usable only by `linear`).

    Does not mutate `weight`; raises RuntimeError when `can_pack` is false for it.
    """
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), DECODE_ROWS_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` for a plain or packed `weight`. Pure."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
