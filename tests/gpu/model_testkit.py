"""Factories and named assertions for the model-runtime tests (tests/gpu/test_model_*.py).

Tiny Qwen3.5 checkpoints are built with transformers itself (a fixed seed, an init scale large enough that
logits spread over several units, and randomised norm weights so the `1 + w` paths are exercised), so our
runtime and the numerical reference read the very same files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5TextConfig
from transformers.models.qwen3_5_moe import Qwen3_5MoeTextConfig

from hybridcache.cache.ids import PageId, SlotId
from hybridcache.gpu.kv_pool import KvPools, pages_for_tokens
from hybridcache.gpu.model import Qwen35Model
from hybridcache.gpu.state_slots import StateSlots

VOCAB = 512
TINY_SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    initializer_range=0.1,
)
MOE_SHAPE = dict(
    num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48
)


def build_reference_checkpoint(directory: Path, moe: bool = False, seed: int = 0, tied: bool = False) -> Path:
    """Write a tiny random Qwen3.5 (or Qwen3.5-MoE) checkpoint with transformers' `save_pretrained`."""
    torch.manual_seed(seed)
    if moe:
        model = Qwen3_5MoeForCausalLM(
            Qwen3_5MoeTextConfig(**TINY_SHAPE, **MOE_SHAPE, tie_word_embeddings=tied)
        )
    else:
        model = Qwen3_5ForCausalLM(
            Qwen3_5TextConfig(**TINY_SHAPE, intermediate_size=128, tie_word_embeddings=tied)
        )
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                parameter.normal_(1.0, 0.3)  # a plain scale
            elif name.endswith("norm.weight"):
                parameter.normal_(0.0, 0.3)  # zero-centred: the forward uses 1 + w
            elif name.endswith("dt_bias"):
                parameter.normal_(0.0, 1.0)
    model.save_pretrained(directory)
    return directory


def load_reference(directory: Path) -> torch.nn.Module:
    """transformers' implementation of the checkpoint, in eval mode (fp32)."""
    config = json.loads((directory / "config.json").read_text())
    cls = Qwen3_5MoeForCausalLM if "Moe" in config["architectures"][0] else Qwen3_5ForCausalLM
    return cls.from_pretrained(directory).eval()


def rewrite_as_multimodal_wrapper(source: Path, target: Path, shards: int = 2) -> Path:
    """Copy a text checkpoint into the multimodal wrapper's layout: `text_config`, `model.language_model.*`
    weights sharded with an index, plus vision and `mtp.*` weights that loading must ignore."""
    target.mkdir(parents=True, exist_ok=True)
    text = json.loads((source / "config.json").read_text())
    wrapper = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": text.pop("tie_word_embeddings"),
        "text_config": text,
        "vision_config": {"depth": 1},
    }
    (target / "config.json").write_text(json.dumps(wrapper))
    weights = {
        name.replace("model.", "model.language_model.", 1): tensor
        for name, tensor in load_file(source / "model.safetensors").items()
    }
    weights["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
    weights["mtp.layers.0.mlp.up_proj.weight"] = torch.zeros(2, 2)
    names = sorted(weights)
    weight_map = {}
    for shard in range(shards):
        filename = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: weights[name].contiguous() for name in names[shard::shards]}
        save_file(part, target / filename, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, filename))
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return target


def prompt_tokens(length: int, seed: int = 7) -> list[int]:
    """A deterministic random prompt."""
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


class Lane(NamedTuple):
    """One sequence's addresses: its block table and its state slot."""

    table: list[PageId]
    slot: SlotId


class Memory(NamedTuple):
    kv: KvPools
    states: StateSlots

    def lanes(self, count: int, pages_each: int) -> list[Lane]:
        """`count` lanes with disjoint, deliberately non-contiguous page ranges (odd/even interleaved)."""
        return [
            Lane([PageId(lane + count * i) for i in range(pages_each)], SlotId(count - 1 - lane))
            for lane in range(count)
        ]


def fresh_memory(model: Qwen35Model, num_pages: int = 48, num_slots: int = 6) -> Memory:
    return Memory(model.new_kv_pools(num_pages), model.new_state_slots(num_slots))


def prefill_in_chunks(
    model: Qwen35Model, tokens: list[int], chunk: int, lane: Lane, memory: Memory
) -> torch.Tensor:
    """Prefill `tokens` `chunk` at a time; return the logits of every position `[n, vocab]`."""
    assert len(lane.table) >= pages_for_tokens(len(tokens))
    pieces = [
        model.prefill(
            tokens[start : start + chunk],
            start,
            lane.table,
            lane.slot,
            memory.kv,
            memory.states,
            all_logits=True,
        )
        for start in range(0, len(tokens), chunk)
    ]
    return torch.cat(pieces)


def greedy_continue(
    model: Qwen35Model, first_logits: torch.Tensor, start: int, steps: int, lane: Lane, memory: Memory
) -> tuple[list[int], torch.Tensor]:
    """Decode `steps` greedy tokens after a prefill of `start` tokens; (tokens, logits `[steps, vocab]`)."""
    tokens, logits = [], []
    current = first_logits
    for step in range(steps):
        token = int(current.argmax())
        tokens.append(token)
        current = model.decode([token], [start + step], [lane.table], [lane.slot], memory.kv, memory.states)[
            0
        ]
        logits.append(current)
    return tokens, torch.stack(logits)
