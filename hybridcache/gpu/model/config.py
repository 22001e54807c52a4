"""`ModelConfig`: the shape of a Qwen3.5 text model, parsed from a Hugging Face `config.json`.

Accepts the text-only classes (`Qwen3_5ForCausalLM`, `Qwen3_5MoeForCausalLM`) and the multimodal wrappers
(`Qwen3_5ForConditionalGeneration`, `Qwen3_5MoeForConditionalGeneration`), whose text shape sits under
`text_config` and whose weights are named `model.language_model.*`. Parsing is pure: nothing here mutates
state; every problem raises `CheckpointError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from hybridcache.gpu.model.errors import CheckpointError

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"

TEXT_ARCHITECTURES = {"Qwen3_5ForCausalLM": False, "Qwen3_5MoeForCausalLM": True}
WRAPPER_ARCHITECTURES = {"Qwen3_5ForConditionalGeneration": False, "Qwen3_5MoeForConditionalGeneration": True}
MODEL_TYPE_ARCHITECTURE = {
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "qwen3_5": "Qwen3_5ForConditionalGeneration",
    "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
}
SUPPORTED_ARCHITECTURES = (*TEXT_ARCHITECTURES, *WRAPPER_ARCHITECTURES)
SUPPORTED_ROPE_TYPES = ("default",)
SUPPORTED_ACTIVATIONS = ("silu",)


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The text model's shape. `layer_types[i]` is `linear_attention` (Gated DeltaNet) or `full_attention`."""

    architecture: str
    weight_prefix: str  # "model." for text-only classes, "model.language_model." for the wrappers
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float
    tie_word_embeddings: bool
    # full attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    attention_bias: bool
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet
    linear_conv_kernel_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    # feed-forward: dense SwiGLU, or MoE with a shared expert
    intermediate_size: int
    is_moe: bool
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    checkpoint_dtype: str | None = None
    eos_token_ids: tuple[int, ...] = ()

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        """Indices of the full-attention layers, in forward order."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == FULL_ATTENTION)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        """Indices of the Gated DeltaNet layers, in forward order."""
        return tuple(i for i, kind in enumerate(self.layer_types) if kind == LINEAR_ATTENTION)

    @property
    def rotary_dim(self) -> int:
        """How many leading dims of each attention head RoPE rotates (partial RoPE)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise causal conv: q, k and v of the Gated DeltaNet stacked."""
        return 2 * self.linear_key_dim + self.linear_value_dim


def read_model_config(path: Path) -> ModelConfig:
    """Read and parse `config.json` at `path`. Raises `CheckpointError` naming the file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(path, "missing: a checkpoint directory needs config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"not readable JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(path, "expected a JSON object")
    return parse_model_config(raw, path)


def parse_model_config(raw: dict[str, Any], path: Path) -> ModelConfig:
    """Parse a config.json object. Pure; raises `CheckpointError` naming `path`."""
    architecture = _architecture(raw, path)
    is_wrapper = architecture in WRAPPER_ARCHITECTURES
    is_moe = TEXT_ARCHITECTURES.get(architecture, WRAPPER_ARCHITECTURES.get(architecture, False))
    text = raw.get("text_config") if is_wrapper else raw
    if not isinstance(text, dict):
        raise CheckpointError(path, f"{architecture} needs a 'text_config' object")
    fields = _Fields(text, path)
    num_layers = fields.int("num_hidden_layers")
    layer_types = _layer_types(text, num_layers, path)
    rope = _rope(text, path)
    tied = raw.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    activation = text.get("hidden_act", "silu")
    if activation not in SUPPORTED_ACTIVATIONS:
        raise CheckpointError(path, f"hidden_act {activation!r} is not supported (supported: silu)")
    config = ModelConfig(
        architecture=architecture,
        weight_prefix="model.language_model." if is_wrapper else "model.",
        vocab_size=fields.int("vocab_size"),
        hidden_size=fields.int("hidden_size"),
        num_hidden_layers=num_layers,
        layer_types=layer_types,
        rms_norm_eps=fields.float("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(tied),
        num_attention_heads=fields.int("num_attention_heads"),
        num_key_value_heads=fields.int("num_key_value_heads"),
        head_dim=fields.int("head_dim", fields.int("hidden_size") // fields.int("num_attention_heads")),
        attention_bias=bool(text.get("attention_bias", False)),
        rope_theta=rope[0],
        partial_rotary_factor=rope[1],
        linear_conv_kernel_dim=fields.int("linear_conv_kernel_dim", 4),
        linear_num_key_heads=fields.int("linear_num_key_heads"),
        linear_num_value_heads=fields.int("linear_num_value_heads"),
        linear_key_head_dim=fields.int("linear_key_head_dim"),
        linear_value_head_dim=fields.int("linear_value_head_dim"),
        intermediate_size=fields.int("intermediate_size", 0),
        is_moe=is_moe,
        num_experts=fields.int("num_experts", 0) if is_moe else 0,
        num_experts_per_tok=fields.int("num_experts_per_tok", 0) if is_moe else 0,
        moe_intermediate_size=fields.int("moe_intermediate_size", 0) if is_moe else 0,
        shared_expert_intermediate_size=fields.int("shared_expert_intermediate_size", 0) if is_moe else 0,
        checkpoint_dtype=text.get("dtype", text.get("torch_dtype", raw.get("dtype", raw.get("torch_dtype")))),
        eos_token_ids=_eos_ids(text.get("eos_token_id", raw.get("eos_token_id"))),
    )
    _check_shape(config, path)
    return config


def _architecture(raw: dict[str, Any], path: Path) -> str:
    declared = raw.get("architectures")
    if isinstance(declared, list) and declared:
        for name in declared:
            if name in SUPPORTED_ARCHITECTURES:
                return name
        raise CheckpointError(
            path, f"unsupported architecture {declared!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    model_type = raw.get("model_type")
    if model_type in MODEL_TYPE_ARCHITECTURE:
        return MODEL_TYPE_ARCHITECTURE[model_type]
    raise CheckpointError(
        path,
        f"unsupported model_type {model_type!r} (no architectures listed); supported: "
        f"{', '.join(SUPPORTED_ARCHITECTURES)} / model_type {', '.join(MODEL_TYPE_ARCHITECTURE)}",
    )


class _Fields:
    """Typed reads of required and optional config fields, each failure naming the file and field."""

    def __init__(self, raw: dict[str, Any], path: Path) -> None:
        self._raw = raw
        self._path = path

    def int(self, name: str, default: int | None = None) -> int:
        value = self._raw.get(name, default)
        if value is None:
            raise CheckpointError(self._path, f"missing field {name!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(self._path, f"field {name!r} must be a non-negative integer, got {value!r}")
        return value

    def float(self, name: str, default: float) -> float:
        value = self._raw.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CheckpointError(self._path, f"field {name!r} must be a number, got {value!r}")
        return float(value)


def _layer_types(text: dict[str, Any], num_layers: int, path: Path) -> tuple[str, ...]:
    declared = text.get("layer_types")
    if declared is None:
        interval = text.get("full_attention_interval", 4)
        return tuple(
            FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers)
        )
    if not isinstance(declared, list) or len(declared) != num_layers:
        raise CheckpointError(path, f"layer_types must list {num_layers} entries")
    unknown = sorted({kind for kind in declared if kind not in (LINEAR_ATTENTION, FULL_ATTENTION)})
    if unknown:
        raise CheckpointError(path, f"unsupported layer types {unknown}")
    return tuple(declared)


def _rope(text: dict[str, Any], path: Path) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor). Text-only positions make M-RoPE sections equal plain RoPE."""
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(path, f"rope_type {rope_type!r} is not supported (supported: default)")
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
    return float(theta), float(factor)


def _eos_ids(value: Any) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, int))
    return ()


def _check_shape(config: ModelConfig, path: Path) -> None:
    if config.num_attention_heads % max(config.num_key_value_heads, 1):
        raise CheckpointError(path, "num_attention_heads must be a multiple of num_key_value_heads")
    if config.linear_num_value_heads % max(config.linear_num_key_heads, 1):
        raise CheckpointError(path, "linear_num_value_heads must be a multiple of linear_num_key_heads")
    if config.rotary_dim % 2:
        raise CheckpointError(path, "head_dim * partial_rotary_factor must be even")
    if config.is_moe and not (
        config.num_experts and config.num_experts_per_tok and config.moe_intermediate_size
    ):
        raise CheckpointError(
            path, "an MoE config needs num_experts, num_experts_per_tok, moe_intermediate_size"
        )
    if not config.is_moe and not config.intermediate_size:
        raise CheckpointError(path, "missing field 'intermediate_size'")
