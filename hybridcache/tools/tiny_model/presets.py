"""Shapes of the random-weight checkpoints `make-tiny-model` writes, and their Hugging Face config files.

A `Preset` names every dimension of a Qwen3.5 text model (`Qwen3_5ForCausalLM`, `model_type:
qwen3_5_text`). `config_json()` spells it with the fields of transformers' `Qwen3_5TextConfig`;
`generation_config_json()` gives the stop tokens. Pure functions over frozen values.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Literal

import msgspec

PresetName = Literal["micro", "tiny", "small"]
StorageDType = Literal["float32", "bfloat16", "float16"]

FULL_ATTENTION_INTERVAL = 4  # Qwen3.5's 3:1 pattern: every fourth layer is full attention
ROPE_THETA = 10_000_000.0
PARTIAL_ROTARY_FACTOR = 0.25  # RoPE rotates the first 25 % of each attention head


class Preset(msgspec.Struct, frozen=True, kw_only=True):
    """Every dimension of one checkpoint shape. `vocabulary` picks the tokenizer: bytes or Qwen3.5's."""

    name: PresetName
    vocabulary: Literal["bytes", "qwen3_5"]
    vocab_size: int  # embedding rows: the tokenizer's size rounded up, like Qwen3.5's 248,320
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    tie_word_embeddings: bool
    max_position_embeddings: int
    default_dtype: StorageDType

    @property
    def layer_types(self) -> list[str]:
        """"linear_attention" or "full_attention" per layer, three linear then one full, repeating."""
        return [
            "full_attention" if (index + 1) % FULL_ATTENTION_INTERVAL == 0 else "linear_attention"
            for index in range(self.num_hidden_layers)
        ]


# micro: the byte vocabulary and the smallest dimensions that still exercise every code path (GQA,
# partial RoPE, two value heads per key head, an untied lm_head) for fast unit tests.
MICRO = Preset(
    name="micro",
    vocabulary="bytes",
    vocab_size=320,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    tie_word_embeddings=False,
    max_position_embeddings=32768,
    default_dtype="float32",
)

# tiny: the server's embedded default; Qwen3.5's real vocabulary, tied embeddings, 4 layers.
TINY = Preset(
    name="tiny",
    vocabulary="qwen3_5",
    vocab_size=248320,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    tie_word_embeddings=True,
    max_position_embeddings=262144,
    default_dtype="float32",
)

# small: benchmark shape, about Qwen3.5-0.8B's (24 layers, hidden 1024, tied), stored in bf16.
SMALL = Preset(
    name="small",
    vocabulary="qwen3_5",
    vocab_size=248320,
    hidden_size=1024,
    intermediate_size=3584,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    tie_word_embeddings=True,
    max_position_embeddings=262144,
    default_dtype="bfloat16",
)

PRESETS: MappingProxyType[str, Preset] = MappingProxyType(
    {preset.name: preset for preset in (MICRO, TINY, SMALL)}
)


def get_preset(name: str) -> Preset:
    """The preset called `name`. Pure; raises ValueError naming the known presets."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}") from None


def config_json(preset: Preset, dtype: StorageDType, eos_token_id: int) -> dict[str, object]:
    """config.json for `Qwen3_5ForCausalLM` with the fields of `Qwen3_5TextConfig`. Pure."""
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "vocab_size": preset.vocab_size,
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_attention_heads": preset.num_attention_heads,
        "num_key_value_heads": preset.num_key_value_heads,
        "head_dim": preset.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": preset.max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "use_cache": True,
        "tie_word_embeddings": preset.tie_word_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "linear_conv_kernel_dim": preset.linear_conv_kernel_dim,
        "linear_key_head_dim": preset.linear_key_head_dim,
        "linear_value_head_dim": preset.linear_value_head_dim,
        "linear_num_key_heads": preset.linear_num_key_heads,
        "linear_num_value_heads": preset.linear_num_value_heads,
        "layer_types": preset.layer_types,
        "full_attention_interval": FULL_ATTENTION_INTERVAL,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": ROPE_THETA,
            "partial_rotary_factor": PARTIAL_ROTARY_FACTOR,
        },
        "bos_token_id": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": None,
        "dtype": dtype,
    }


def generation_config_json(eos_token_ids: list[int], pad_token_id: int) -> dict[str, object]:
    """generation_config.json: stop on <|im_end|> and <|endoftext|>, Qwen3.5's thinking-mode sampling."""
    return {
        "bos_token_id": None,
        "eos_token_id": eos_token_ids,
        "pad_token_id": pad_token_id,
        "do_sample": True,
        "temperature": 0.6,
        "top_k": 20,
        "top_p": 0.95,
    }
