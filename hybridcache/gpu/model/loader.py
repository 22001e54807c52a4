"""Build a `Qwen35Model` from a Hugging Face checkpoint directory.

Weights are zero-copy views into the memory-mapped safetensors files whenever the requested dtype is the
stored one, except the projections that share an input (GDN qkv/z/b/a, attention q/k/v, MLP gate/up),
which are stacked into one matrix so that one matmul call computes them, and the small per-channel vectors
(norm scales, `-exp(A_log)`). On a CPU in bf16 the matmul weights are instead packed for oneDNN
(`linear.py`) one at a time, and embedding lookups read their rows from the file (`embedding_rows.py`).
Every copy replaces its mapped pages, so resident memory stays about the size of the weights either way.
`mtp.*` and vision weights are never touched. Every problem raises `CheckpointError` naming the file at
fault.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hybridcache.gpu.model.attention import FullAttention
from hybridcache.gpu.model.checkpoint import CheckpointWeights
from hybridcache.gpu.model.config import FULL_ATTENTION, ModelConfig, read_model_config
from hybridcache.gpu.model.embedding_rows import EmbeddingRows
from hybridcache.gpu.model.errors import CheckpointError
from hybridcache.gpu.model.gated_deltanet import GatedDeltaNet
from hybridcache.gpu.model.linear import pack_weight
from hybridcache.gpu.model.mlp import SwiGluMlp
from hybridcache.gpu.model.moe import MoeBlock
from hybridcache.gpu.model.norm import norm_scale
from hybridcache.gpu.model.onednn_packing import can_pack
from hybridcache.gpu.model.qwen3_5 import DecoderLayer, Qwen35Model

CONFIG_FILE = "config.json"
ROW_BLOCK = 16384
"""Output rows per packed block of the lm_head: packing a block at a time keeps loading's transient memory
at one block (the vocabulary projection is the largest weight)."""


class _Reader:
    """Shape-checked, dtype-converted weight reads (conversion copies only when the dtype differs).

    With `pack`, matmul weights come back packed for oneDNN (see `linear.py`) and the pages of their source
    in the mapping are dropped once copied, so loading holds one resident copy of each weight.
    """

    def __init__(
        self, weights: CheckpointWeights, dtype: torch.dtype, device: torch.device, pack: bool
    ) -> None:
        self.weights = weights
        self.dtype = dtype
        self.device = device
        self.pack = pack

    def view(self, name: str, *shape: int) -> torch.Tensor:
        """The stored tensor `name` (a view into the mapping), checked against `shape`."""
        tensor = self.weights.tensor(name)
        if tuple(tensor.shape) != shape:
            raise CheckpointError(
                self.weights.file_of(name),
                f"weight {name!r} has shape {list(tensor.shape)}, expected {list(shape)}",
            )
        return tensor

    def get(self, name: str, *shape: int) -> torch.Tensor:
        return self.view(name, *shape).to(device=self.device, dtype=self.dtype)

    def optional(self, name: str, *shape: int) -> torch.Tensor | None:
        return self.get(name, *shape) if self.weights.has(name) else None

    def matmul_weight(self, name: str, *shape: int) -> torch.Tensor:
        """A `[out, in]` weight for `linear`: packed (its source pages released) or a plain view."""
        if not self.pack:
            return self.get(name, *shape)
        packed = pack_weight(self.get(name, *shape))
        self.weights.release(name)
        return packed

    def fused_matmul_weight(self, parts: list[tuple[str, int]], columns: int) -> torch.Tensor:
        """The weights `parts` (name, rows), each `[rows, columns]`, stacked by rows into one `[sum rows,
        columns]` weight for `linear` (packed when packing); the sources' mapped pages are released once
        copied, so one resident copy remains."""
        stacked = torch.cat([self.get(name, rows, columns) for name, rows in parts])
        for name, _ in parts:
            self.weights.release(name)
        return pack_weight(stacked) if self.pack else stacked

    def fused_bias(self, parts: list[tuple[str, int]]) -> torch.Tensor | None:
        """The biases of `parts` concatenated (None when the first has none)."""
        if not self.weights.has(parts[0][0]):
            return None
        return torch.cat([self.get(name, rows) for name, rows in parts])

    def matmul_row_blocks(self, name: str, *shape: int) -> tuple[torch.Tensor, ...]:
        """A large `[out, in]` weight as blocks of `ROW_BLOCK` output rows, each packed and its source pages
        released before the next is read (one whole plain view when not packing)."""
        if not self.pack:
            return (self.get(name, *shape),)
        stored = self.view(name, *shape)
        blocks = []
        for start in range(0, shape[0], ROW_BLOCK):
            rows = slice(start, min(start + ROW_BLOCK, shape[0]))
            blocks.append(pack_weight(stored[rows].to(device=self.device, dtype=self.dtype)))
            self.weights.release(name, rows)
        return tuple(blocks)

    def pack_slice(self, tensor: torch.Tensor) -> torch.Tensor:
        """A slice of a stored weight (an expert of a fused layout), packed when packing."""
        return pack_weight(tensor) if self.pack else tensor


def load_model(
    directory: Path | str,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    pack_weights: bool | None = None,
) -> Qwen35Model:
    """Load the checkpoint in `directory` (default dtype: the stored one). Raises `CheckpointError`.

    `pack_weights` (default: wherever `can_pack` says it applies, i.e. CPU bf16) stores the matmul
    weights packed for oneDNN, which roughly doubles CPU decode speed; each packed copy replaces its mapped
    pages, so resident memory stays about the size of the weights.
    """
    directory = Path(directory)
    config = read_model_config(directory / CONFIG_FILE)
    weights = CheckpointWeights(directory)
    prefix = config.weight_prefix
    dtype = dtype or _stored_dtype(weights, config) or torch.float32
    device = torch.device(device)
    pack = can_pack(dtype, device) if pack_weights is None else pack_weights
    reader = _Reader(weights, dtype, device, pack)
    embed = reader.get(prefix + "embed_tokens.weight", config.vocab_size, config.hidden_size)
    layers = [_decoder_layer(reader, config, i) for i in range(config.num_hidden_layers)]
    final_norm = norm_scale(reader.get(prefix + "norm.weight", config.hidden_size))
    if config.tie_word_embeddings and not pack:
        lm_head: tuple[torch.Tensor, ...] = (embed,)  # one table serves both
    else:
        head_name = prefix + "embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        lm_head = reader.matmul_row_blocks(head_name, config.vocab_size, config.hidden_size)
    rows = _embedding_rows(weights, prefix + "embed_tokens.weight", dtype) if pack else None
    return Qwen35Model(config, embed, layers, final_norm, lm_head, rows)


def _embedding_rows(weights: CheckpointWeights, name: str, dtype: torch.dtype) -> EmbeddingRows:
    """Lookups that read rows from the file (see embedding_rows.py); the table's mapped pages are dropped."""
    path, offset, entry = weights.location(name)
    weights.release(name)
    return EmbeddingRows(path, offset, entry.shape[0], entry.shape[1], entry.dtype, dtype)


def stored_dtype(directory: Path | str) -> torch.dtype | None:
    """The dtype the checkpoint in `directory` stores its embedding in (None when it has none). Reads only
    the headers. Raises `CheckpointError`."""
    directory = Path(directory)
    return _stored_dtype(CheckpointWeights(directory), read_model_config(directory / CONFIG_FILE))


def _stored_dtype(weights: CheckpointWeights, config: ModelConfig) -> torch.dtype | None:
    name = config.weight_prefix + "embed_tokens.weight"
    return weights.tensor(name).dtype if weights.has(name) else None


def _decoder_layer(reader: _Reader, config: ModelConfig, index: int) -> DecoderLayer:
    name = f"{config.weight_prefix}layers.{index}."
    hidden = config.hidden_size
    if config.layer_types[index] == FULL_ATTENTION:
        mixer: GatedDeltaNet | FullAttention = _attention(reader, config, name + "self_attn.")
        memory_index = config.full_attention_layers.index(index)
    else:
        mixer = _gated_deltanet(reader, config, name + "linear_attn.")
        memory_index = config.linear_attention_layers.index(index)
    feed_forward = (
        _moe(reader, config, name + "mlp.")
        if config.is_moe
        else _mlp(reader, name + "mlp.", hidden, config.intermediate_size)
    )
    return DecoderLayer(
        input_norm=norm_scale(reader.get(name + "input_layernorm.weight", hidden)),
        post_norm=norm_scale(reader.get(name + "post_attention_layernorm.weight", hidden)),
        mixer=mixer,
        feed_forward=feed_forward,
        memory_index=memory_index,
    )


def _attention(reader: _Reader, config: ModelConfig, name: str) -> FullAttention:
    hidden, heads, kv_heads, head_dim = (
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    bias = config.attention_bias
    rows = {"q_proj": 2 * heads * head_dim, "k_proj": kv_heads * head_dim, "v_proj": kv_heads * head_dim}
    return FullAttention(
        qkv_proj=reader.fused_matmul_weight([(f"{name}{p}.weight", n) for p, n in rows.items()], hidden),
        o_proj=reader.matmul_weight(name + "o_proj.weight", hidden, heads * head_dim),
        qkv_bias=reader.fused_bias([(f"{name}{p}.bias", n) for p, n in rows.items()]) if bias else None,
        o_bias=reader.get(name + "o_proj.bias", hidden) if bias else None,
        q_norm=norm_scale(reader.get(name + "q_norm.weight", head_dim)),
        k_norm=norm_scale(reader.get(name + "k_norm.weight", head_dim)),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        eps=config.rms_norm_eps,
    )


def _gated_deltanet(reader: _Reader, config: ModelConfig, name: str) -> GatedDeltaNet:
    hidden, value_heads = config.hidden_size, config.linear_num_value_heads
    conv = reader.get(name + "conv1d.weight", config.conv_dim, 1, config.linear_conv_kernel_dim)
    a_log = reader.weights.tensor(name + "A_log")
    if tuple(a_log.shape) != (value_heads,):
        raise CheckpointError(
            reader.weights.file_of(name + "A_log"),
            f"weight {name + 'A_log'!r} has shape {list(a_log.shape)}, expected [{value_heads}]",
        )
    projections = [
        (name + "in_proj_qkv.weight", config.conv_dim),
        (name + "in_proj_z.weight", config.linear_value_dim),
        (name + "in_proj_b.weight", value_heads),
        (name + "in_proj_a.weight", value_heads),
    ]
    return GatedDeltaNet(
        in_proj=reader.fused_matmul_weight(projections, hidden),
        conv_weight=conv.squeeze(1),
        neg_a=-a_log.float().exp().to(reader.device),
        dt_bias=reader.get(name + "dt_bias", value_heads),
        norm_weight=reader.get(name + "norm.weight", config.linear_value_head_dim),
        out_proj=reader.matmul_weight(name + "out_proj.weight", hidden, config.linear_value_dim),
        key_heads=config.linear_num_key_heads,
        value_heads=value_heads,
        key_head_dim=config.linear_key_head_dim,
        value_head_dim=config.linear_value_head_dim,
        eps=config.rms_norm_eps,
    )


def _mlp(reader: _Reader, name: str, hidden: int, intermediate: int) -> SwiGluMlp:
    gate_up = [(name + "gate_proj.weight", intermediate), (name + "up_proj.weight", intermediate)]
    return SwiGluMlp(
        gate_up_proj=reader.fused_matmul_weight(gate_up, hidden),
        down_proj=reader.matmul_weight(name + "down_proj.weight", hidden, intermediate),
    )


def _moe(reader: _Reader, config: ModelConfig, name: str) -> MoeBlock:
    hidden, experts = config.hidden_size, config.num_experts
    return MoeBlock(
        router=reader.matmul_weight(name + "gate.weight", experts, hidden),
        experts=_experts(reader, config, name + "experts."),
        shared_expert=_mlp(reader, name + "shared_expert.", hidden, config.shared_expert_intermediate_size),
        shared_expert_gate=reader.matmul_weight(name + "shared_expert_gate.weight", 1, hidden),
        top_k=config.num_experts_per_tok,
    )


def _experts(reader: _Reader, config: ModelConfig, name: str) -> tuple[SwiGluMlp, ...]:
    """Per-expert weights (`experts.{e}.gate_proj.weight` ...) or slices of the fused 3-D layout."""
    hidden, experts, inner = config.hidden_size, config.num_experts, config.moe_intermediate_size
    if reader.weights.has(name + "gate_up_proj"):
        gate_up = reader.get(name + "gate_up_proj", experts, 2 * inner, hidden)
        down = reader.get(name + "down_proj", experts, hidden, inner)
        fused = tuple(
            SwiGluMlp(reader.pack_slice(gate_up[e]), reader.pack_slice(down[e])) for e in range(experts)
        )
        if reader.pack:
            reader.weights.release(name + "gate_up_proj")
            reader.weights.release(name + "down_proj")
        return fused
    return tuple(_mlp(reader, f"{name}{e}.", hidden, inner) for e in range(experts))
