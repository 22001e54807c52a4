"""Linear layers whose weights may be prepacked for the CPU's matmul library (oneDNN).

On a CPU, oneDNN's bf16 matmul repacks a plain `[out, in]` weight into its blocked layout on every call. For
prefill that is a small cost next to the arithmetic, but decode multiplies a few rows by every weight of the
model, so the per-call repacking roughly halves the speed at which weights stream from memory. `pack_weight`
does the repacking once, at load time; `linear` computes the same product from either form (the packed and
plain products are the same kernel on the same numbers: bit-identical results). Decode's products of up to
`cpu_gemv.MAX_ROWS` rows on a packed weight run a kernel of our own over the same packed bytes instead,
which streams them about 1.3-1.9x faster than oneDNN's (`cpu_gemv.py`). Packed weights are moved onto
2 MiB pages where the kernel allows (`huge_pages.py`), which streams them about 5 % faster again.

Packing applies only where it pays and exists: a CPU, bf16, and a torch build whose oneDNN has the internal
reorder op and bf16 support on this CPU. Everywhere else (fp32, fp16, CUDA) weights stay plain tensors and
`linear` is `F.linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hybridcache.gpu import huge_pages
from hybridcache.gpu.model import cpu_gemv
from hybridcache.gpu.model.onednn_packing import reorder


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """A packed copy of the plain `[out, in]` weight (an opaque oneDNN tensor, usable only by `linear`).

    Does not mutate `weight`; raises RuntimeError when `can_pack` is false for it. Decode's products on it
    run `cpu_gemv`'s kernel where that applies.
    """
    packed = reorder(weight)
    if hasattr(torch.ops.mkldnn, "data_ptr") and hasattr(torch.ops.mkldnn, "_nbytes"):
        huge_pages.collapse(int(torch.ops.mkldnn.data_ptr(packed)), int(torch.ops.mkldnn._nbytes(packed)))
    cpu_gemv.register(packed)
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` for a plain or packed `weight`. Pure."""
    if weight.is_mkldnn:
        if cpu_gemv.applies(x, weight):
            return cpu_gemv.product(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
