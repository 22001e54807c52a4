"""How close two logits tensors are, and the tolerances the model's exactness is measured against.

`relative_error(a, b)` is `max|a - b| / max|b|`. Different chunkings of one prompt (and a resume from a
restored state, which is a chunking) reorder floating-point sums in the delta rule and attention, so logits
agree only to rounding; `CHUNK_DECOMPOSITION_RTOL` is the bound tests/gpu/test_model_chunking.py measures
against (fp32; the measured error there is ~1e-6). Greedy tokens are expected to be identical.
"""

from __future__ import annotations

import torch

REFERENCE_RTOL = 1e-4
"""fp32 agreement with transformers' implementation."""

CHUNK_DECOMPOSITION_RTOL = 1e-4
"""fp32 agreement between chunkings of one prompt (and resumes measured against them)."""

BF16_RTOL = 0.1
"""bf16 vs fp32 agreement: a loose smoke bound."""


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """`max|actual - expected| / max|expected|`, in fp32. Pure."""
    expected = expected.float()
    scale = float(expected.abs().max()) or 1.0
    return float((actual.float() - expected).abs().max()) / scale


def assert_logits_close(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float = CHUNK_DECOMPOSITION_RTOL, what: str = "logits"
) -> float:
    """Raise AssertionError when `relative_error(actual, expected) > rtol`; return the error otherwise."""
    if actual.shape != expected.shape:
        raise AssertionError(f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    error = relative_error(actual, expected)
    if not error <= rtol:
        raise AssertionError(f"{what}: relative error {error:.3g} > {rtol:.3g}")
    return error
