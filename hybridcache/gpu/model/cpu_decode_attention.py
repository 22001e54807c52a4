"""Decode's attention on the CPU by a kernel of our own (`cpu_decode_attention.c`).

torch's CPU flash attention, given one query row per head, spent about six times the time its keys and
values take to stream (1.8 ms per layer at 8,192 keys on `small`, 2 threads), so at long contexts
attention, not the weights, set the decode step's length. The kernel reads each key and value once, in
float32 arithmetic, and each lane's result depends only on its query and context (see the C source). With
its prefetches (the C source says why) `small`'s decode step at 32k context ran at 16.7 tok/s against 11.0
without them (2 threads, AMD EPYC); served, `bench peer --contexts 32768` measured 15.4 tok/s beside 5.7
for llama.cpp's llama-server on the same machine. It applies on a CPU where the kernels library is in use
(`cpu_kernels.py`), to bf16 planes, a head size that is a multiple of 32 and at most 8 query heads per KV
head; anything else keeps torch's attention.
"""

from __future__ import annotations

import torch

from hybridcache.gpu.model import cpu_kernels

MAX_GROUP = 8


def applies(query: torch.Tensor, plane: torch.Tensor, group: int) -> bool:
    """Whether `attend` runs for this query and these bf16 planes."""
    return (
        plane.device.type == "cpu"
        and query.dtype == plane.dtype == torch.bfloat16
        and plane.is_contiguous()
        and query.shape[-1] % 32 == 0
        and group <= MAX_GROUP
        and cpu_kernels.library() is not None
    )


def attend(
    query: torch.Tensor, flat_k: torch.Tensor, flat_v: torch.Tensor, rows: slice | torch.Tensor, scale: float
) -> torch.Tensor:
    """One lane's attention: `query [kv_heads, group, D]` over the context `rows` of the contiguous flat
    planes `[rows, kv_heads, D]` -> `[kv_heads, group, D]` bf16. Pure (check `applies` first)."""
    kv_heads, group, head_dim = query.shape
    query = query.contiguous()
    out = torch.empty_like(query)
    if isinstance(rows, slice):
        index, first, length = None, rows.start, rows.stop - rows.start
    else:
        rows = rows.contiguous()
        index, first, length = rows.data_ptr(), 0, rows.numel()
    failed = cpu_kernels.library().hc_decode_attention_bf16(
        query.data_ptr(), flat_k.data_ptr(), flat_v.data_ptr(), index, first, length,
        kv_heads, group, head_dim, scale, out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    if failed:
        raise MemoryError(f"decode attention: no scratch for {length} keys")
    return out
