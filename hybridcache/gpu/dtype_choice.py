"""`--dtype auto`: which compute dtype a checkpoint runs in on a device, and why (for the startup ledger).

On a GPU the checkpoint's own dtype is always right. On a CPU it is right only where the processor computes
it natively: bf16 matmuls with AVX512-BF16 or AMX run at about twice fp32's speed (half the bytes to stream,
the same arithmetic units), but without them oneDNN emulates bf16 through fp32 conversions and is slower
than plain fp32. fp16 has no fast CPU matmul path in oneDNN that we rely on, so it computes in float32.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

CPUINFO = Path("/proc/cpuinfo")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
EXPLICIT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DtypeChoice(NamedTuple):
    """The compute dtype, or None for the checkpoint's stored dtype, and the reason in words."""

    dtype: torch.dtype | None
    reason: str


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    """The feature flags of the first processor in `cpuinfo` (empty when unreadable, e.g. not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def native_bf16_flags(flags: frozenset[str]) -> list[str]:
    """The flags among `flags` that give native bf16 matmuls (empty when none do)."""
    return [flag for flag in BF16_CPU_FLAGS if flag in flags]


def choose_dtype(
    requested: str, device: torch.device, stored: torch.dtype | None, flags: frozenset[str] | None = None
) -> DtypeChoice:
    """The dtype to compute in for `--dtype requested` on `device`, with `stored` the checkpoint's dtype.

    `flags` defaults to this machine's CPU flags (read only for `auto` on a CPU). Pure otherwise.
    """
    if requested != "auto":
        return DtypeChoice(EXPLICIT[requested], "--dtype")
    if device.type != "cpu":
        return DtypeChoice(None, "auto: the checkpoint's dtype on a GPU")
    if stored in (None, torch.float32):
        return DtypeChoice(torch.float32, "auto: the checkpoint is float32")
    if stored == torch.bfloat16:
        native = native_bf16_flags(cpu_flags() if flags is None else flags)
        if native:
            flags_text = ", ".join(native)
            return DtypeChoice(torch.bfloat16, f"auto: bf16 checkpoint, native on this CPU ({flags_text})")
        return DtypeChoice(torch.float32, "auto: bf16 checkpoint, but this CPU has no avx512_bf16/amx_bf16")
    stored_name = str(stored).removeprefix("torch.")
    return DtypeChoice(torch.float32, f"auto: {stored_name} checkpoint, float32 on a CPU")
