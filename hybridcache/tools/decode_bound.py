"""The physical limit of single-lane decode on a CPU: bytes one step must read over the memory bandwidth.

A decode step of one lane reads every matmul weight once (each layer's projections and the lm_head; the
embedding contributes one row), the lane's K and V of every full-attention layer up to its position, and
reads and writes its Gated DeltaNet states (fp32 recurrent state and conv history). Nothing else is large.
Dividing those bytes by the machine's read bandwidth, measured in the same run with the same thread count,
gives the fastest decode any implementation could reach here; `decode_vs_bandwidth_limit` says how close a
measured rate is.
"""

from __future__ import annotations

import time
from typing import NamedTuple

import torch

from hybridcache.gpu.huge_pages import collapse
from hybridcache.gpu.model.config import ModelConfig

BANDWIDTH_BUFFER_BYTES = 1 << 30
"""Large enough to defeat every cache level of these machines (the largest L3 seen here is 300 MiB)."""


class DecodeBytes(NamedTuple):
    weights: int
    kv: int
    state: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.state


def decode_step_bytes(config: ModelConfig, dtype: torch.dtype, context: int) -> DecodeBytes:
    """Bytes one single-lane decode step at position `context` reads (dense models; MoE counts the experts
    a token uses). Pure."""
    size = dtype.itemsize
    hidden = config.hidden_size
    per_layer_mlp = _mlp_params(config)
    attention = hidden * (2 * config.num_attention_heads * config.head_dim) + 2 * hidden * (
        config.num_key_value_heads * config.head_dim
    ) + config.num_attention_heads * config.head_dim * hidden
    value_dim = config.linear_num_value_heads * config.linear_value_head_dim
    linear = hidden * (config.conv_dim + value_dim + 2 * config.linear_num_value_heads) + value_dim * hidden
    params = (
        len(config.full_attention_layers) * attention
        + len(config.linear_attention_layers) * linear
        + config.num_hidden_layers * per_layer_mlp
        + config.vocab_size * hidden  # the lm_head (tied or not, it is read whole every step)
    )
    kv = len(config.full_attention_layers) * 2 * (context + 1) * config.num_key_value_heads * config.head_dim
    recurrent = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    conv = config.conv_dim * (config.linear_conv_kernel_dim - 1)
    state = len(config.linear_attention_layers) * 2 * (recurrent * 4 + conv * size)  # read and written
    return DecodeBytes(params * size, kv * size, state)


def _mlp_params(config: ModelConfig) -> int:
    hidden = config.hidden_size
    if not config.is_moe:
        return 3 * hidden * config.intermediate_size
    experts = config.num_experts_per_tok * 3 * hidden * config.moe_intermediate_size
    shared = 3 * hidden * config.shared_expert_intermediate_size
    return experts + shared + hidden * (config.num_experts + 1)


def read_bandwidth_bytes_s(threads: int, repeats: int = 7) -> float:
    """This machine's memory read bandwidth with `threads` torch threads: the best of `repeats` sums over a
    buffer no cache holds, on 2 MiB pages where the system allows (as the packed weights are: `huge_pages`),
    since those stream faster. Sets torch's thread count for the duration, then restores it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buffer = torch.ones(BANDWIDTH_BUFFER_BYTES // 4, dtype=torch.float32)
        collapse(buffer.data_ptr(), BANDWIDTH_BUFFER_BYTES)
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            buffer.sum()
            best = min(best, time.perf_counter() - started)
        return BANDWIDTH_BUFFER_BYTES / best
    finally:
        torch.set_num_threads(previous)
