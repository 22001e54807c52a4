"""oneDNN's packing of a bf16 `[out, in]` weight for its CPU matmul, and where it applies (`linear.py`)."""

from __future__ import annotations

import torch

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


def reorder(weight: torch.Tensor) -> torch.Tensor:
    """oneDNN's packed copy of the plain `weight` (an opaque mkldnn tensor). Pure."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), DECODE_ROWS_HINT)
