"""Weight names, shapes and seeded random values of a Qwen3.5 text checkpoint (`Qwen3_5ForCausalLM`).

The names and shapes are the ones transformers' Qwen3.5 modeling code declares (`model.embed_tokens`,
`model.layers.N.linear_attn.*` for Gated DeltaNet layers, `model.layers.N.self_attn.*` for full
attention, `model.norm`, `lm_head` when untied), enumerated here so nothing imports transformers at run
time. Values come from one seeded `torch.Generator` drawn in enumeration order, so a preset and a seed
always give the same tensors.
"""

from __future__ import annotations

import math
from enum import Enum
from types import MappingProxyType
from typing import NamedTuple

import torch

from hybridcache.tools.tiny_model.presets import Preset, StorageDType

MATRIX_STD = 0.02  # projections and embeddings
NORM_STD = 0.1  # spread of RMSNorm weights around their neutral value
A_RANGE = (0.1, 2.0)  # decay rates A (stored as A_log): slow enough that the state carries context
DT_BIAS_RANGE = (-4.0, 1.0)  # softplus(a + dt_bias) then spans ~0.02..1.3


class Init(Enum):
    """How one weight is drawn."""

    MATRIX = "matrix"  # normal(0, MATRIX_STD)
    CONV = "conv"  # normal(0, 1/sqrt(kernel)): a depthwise kernel that neither vanishes nor explodes
    NORM_OFFSET = "norm_offset"  # zero-centred RMSNorm weight (scales by 1 + w): normal(0, NORM_STD)
    NORM_SCALE = "norm_scale"  # plain scale (the gated RMSNorm multiplies by w): 1 + normal(0, NORM_STD)
    A_LOG = "a_log"  # log(uniform(A_RANGE))
    DT_BIAS = "dt_bias"  # uniform(DT_BIAS_RANGE)


class WeightSpec(NamedTuple):
    """One tensor of the checkpoint: its name, shape and initialisation."""

    name: str
    shape: tuple[int, ...]
    init: Init


def weight_specs(preset: Preset) -> list[WeightSpec]:
    """Every tensor a `Qwen3_5ForCausalLM` of this shape loads, in forward order. Pure."""
    hidden = preset.hidden_size
    specs = [WeightSpec("model.embed_tokens.weight", (preset.vocab_size, hidden), Init.MATRIX)]
    for index, layer_type in enumerate(preset.layer_types):
        prefix = f"model.layers.{index}"
        specs.append(WeightSpec(f"{prefix}.input_layernorm.weight", (hidden,), Init.NORM_OFFSET))
        if layer_type == "linear_attention":
            specs.extend(_gated_delta_net_specs(preset, f"{prefix}.linear_attn"))
        else:
            specs.extend(_full_attention_specs(preset, f"{prefix}.self_attn"))
        specs.append(WeightSpec(f"{prefix}.post_attention_layernorm.weight", (hidden,), Init.NORM_OFFSET))
        specs.extend(_mlp_specs(preset, f"{prefix}.mlp"))
    specs.append(WeightSpec("model.norm.weight", (hidden,), Init.NORM_OFFSET))
    if not preset.tie_word_embeddings:
        specs.append(WeightSpec("lm_head.weight", (preset.vocab_size, hidden), Init.MATRIX))
    return specs


def _gated_delta_net_specs(preset: Preset, prefix: str) -> list[WeightSpec]:
    hidden = preset.hidden_size
    key_dim = preset.linear_num_key_heads * preset.linear_key_head_dim
    value_dim = preset.linear_num_value_heads * preset.linear_value_head_dim
    conv_dim = 2 * key_dim + value_dim
    value_heads = preset.linear_num_value_heads
    return [
        WeightSpec(f"{prefix}.in_proj_qkv.weight", (conv_dim, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.in_proj_z.weight", (value_dim, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.in_proj_b.weight", (value_heads, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.in_proj_a.weight", (value_heads, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.conv1d.weight", (conv_dim, 1, preset.linear_conv_kernel_dim), Init.CONV),
        WeightSpec(f"{prefix}.dt_bias", (value_heads,), Init.DT_BIAS),
        WeightSpec(f"{prefix}.A_log", (value_heads,), Init.A_LOG),
        WeightSpec(f"{prefix}.norm.weight", (preset.linear_value_head_dim,), Init.NORM_SCALE),
        WeightSpec(f"{prefix}.out_proj.weight", (hidden, value_dim), Init.MATRIX),
    ]


def _full_attention_specs(preset: Preset, prefix: str) -> list[WeightSpec]:
    hidden = preset.hidden_size
    head_dim = preset.head_dim
    query_dim = preset.num_attention_heads * head_dim
    kv_dim = preset.num_key_value_heads * head_dim
    return [
        # q_proj yields the query and its output gate per head: [head0 query | head0 gate | head1 ...].
        WeightSpec(f"{prefix}.q_proj.weight", (2 * query_dim, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.k_proj.weight", (kv_dim, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.v_proj.weight", (kv_dim, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.o_proj.weight", (hidden, query_dim), Init.MATRIX),
        WeightSpec(f"{prefix}.q_norm.weight", (head_dim,), Init.NORM_OFFSET),
        WeightSpec(f"{prefix}.k_norm.weight", (head_dim,), Init.NORM_OFFSET),
    ]


def _mlp_specs(preset: Preset, prefix: str) -> list[WeightSpec]:
    hidden, inner = preset.hidden_size, preset.intermediate_size
    return [
        WeightSpec(f"{prefix}.gate_proj.weight", (inner, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.up_proj.weight", (inner, hidden), Init.MATRIX),
        WeightSpec(f"{prefix}.down_proj.weight", (hidden, inner), Init.MATRIX),
    ]


TORCH_DTYPES: MappingProxyType[str, torch.dtype] = MappingProxyType(
    {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
)


def random_weights(preset: Preset, seed: int, dtype: StorageDType) -> dict[str, torch.Tensor]:
    """Every tensor of `weight_specs(preset)`, drawn in order from one generator seeded with `seed`.

    Values are drawn in float32 and then cast, so a seed gives the same numbers in every storage dtype
    (up to rounding). Pure: the same arguments give bit-identical tensors.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)
    target = TORCH_DTYPES[dtype]
    return {spec.name: _draw(spec, generator).to(target).contiguous() for spec in weight_specs(preset)}


def _draw(spec: WeightSpec, generator: torch.Generator) -> torch.Tensor:
    values = torch.empty(spec.shape, dtype=torch.float32)
    match spec.init:
        case Init.MATRIX:
            return values.normal_(0.0, MATRIX_STD, generator=generator)
        case Init.CONV:
            return values.normal_(0.0, 1.0 / math.sqrt(spec.shape[-1]), generator=generator)
        case Init.NORM_OFFSET:
            return values.normal_(0.0, NORM_STD, generator=generator)
        case Init.NORM_SCALE:
            return values.normal_(1.0, NORM_STD, generator=generator)
        case Init.A_LOG:
            return values.uniform_(*A_RANGE, generator=generator).log_()
        case Init.DT_BIAS:
            return values.uniform_(*DT_BIAS_RANGE, generator=generator)
    raise AssertionError(f"unhandled init {spec.init}")
