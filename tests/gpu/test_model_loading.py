"""Checkpoint loading: the layouts we accept, and one clear `CheckpointError` naming the file per fault."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from model_testkit import fresh_memory, prompt_tokens
from safetensors.torch import load_file, save_file

from hybridcache.gpu.model import CheckpointError, load_model, read_model_config
from hybridcache.gpu.model.checkpoint import SafetensorsFile
from hybridcache.gpu.model.tolerance import BF16_RTOL, assert_logits_close


@pytest.fixture
def broken(tmp_path: Path, dense_checkpoint: Path) -> Path:
    """A private copy of the dense checkpoint that a test may damage."""
    return Path(shutil.copytree(dense_checkpoint, tmp_path / "ckpt"))


def expect_checkpoint_error(directory: Path, file_name: str, *phrases: str) -> CheckpointError:
    with pytest.raises(CheckpointError) as caught:
        load_model(directory)
    assert caught.value.path.name == file_name, f"the error names {caught.value.path}, not {file_name}"
    for phrase in phrases:
        assert phrase in str(caught.value), f"{phrase!r} not in {caught.value}"
    return caught.value


def last_logits(model, tokens: list[int]) -> torch.Tensor:
    memory = fresh_memory(model)
    lane = memory.lanes(1, 2)[0]
    return model.prefill(tokens, 0, lane.table, lane.slot, memory.kv, memory.states)


def rewrite_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def rewrite_weights(directory: Path, change) -> None:
    path = directory / "model.safetensors"
    weights = load_file(path)
    change(weights)
    save_file(weights, path, metadata={"format": "pt"})


def test_the_transformers_checkpoint_loads_with_its_shape(dense_model):
    config = dense_model.config
    assert config.architecture == "Qwen3_5ForCausalLM"
    assert config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    assert config.rotary_dim == 8 and config.head_dim == 32
    assert not config.tie_word_embeddings and dense_model.lm_head is not dense_model.embed_tokens


def test_weights_are_views_of_the_mapped_file_not_copies(dense_model, dense_checkpoint: Path):
    """Two weights lie exactly as far apart in memory as in the file: both point into one mapping. (The
    projections that one matmul call computes together are stacked copies; every other weight is a view.)"""
    entries = SafetensorsFile(dense_checkpoint / "model.safetensors").entries
    embed, out = dense_model.embed_tokens, dense_model.layers[0].mixer.out_proj
    file_distance = (
        entries["model.layers.0.linear_attn.out_proj.weight"].begin
        - entries["model.embed_tokens.weight"].begin
    )
    assert out.data_ptr() - embed.data_ptr() == file_distance


def test_the_multimodal_wrapper_loads_and_computes_the_same(wrapper_checkpoint: Path, dense_model):
    wrapped = load_model(wrapper_checkpoint)
    assert wrapped.config.weight_prefix == "model.language_model."
    tokens = prompt_tokens(50)
    assert torch.equal(last_logits(wrapped, tokens), last_logits(dense_model, tokens))


def test_moe_checkpoint_loads_per_expert_weights(moe_model):
    assert moe_model.config.is_moe and len(moe_model.layers[0].feed_forward.experts) == 8


def test_missing_config(broken: Path):
    (broken / "config.json").unlink()
    expect_checkpoint_error(broken, "config.json", "missing")


def test_malformed_config(broken: Path):
    (broken / "config.json").write_text("{not json")
    expect_checkpoint_error(broken, "config.json", "JSON")


def test_unknown_architecture_names_the_supported_ones(broken: Path):
    rewrite_config(broken, architectures=["LlamaForCausalLM"], model_type="llama")
    error = expect_checkpoint_error(broken, "config.json", "LlamaForCausalLM")
    assert "Qwen3_5ForCausalLM" in str(error) and "Qwen3_5MoeForCausalLM" in str(error)


def test_missing_weight_file(broken: Path):
    (broken / "model.safetensors").unlink()
    expect_checkpoint_error(broken, "model.safetensors", "missing")


def test_missing_weight(broken: Path):
    rewrite_weights(broken, lambda weights: weights.pop("model.layers.3.self_attn.k_proj.weight"))
    expect_checkpoint_error(broken, "model.safetensors", "model.layers.3.self_attn.k_proj.weight")


def test_wrong_shape(broken: Path):
    def shrink(weights):
        weights["model.layers.0.linear_attn.in_proj_z.weight"] = weights[
            "model.layers.0.linear_attn.in_proj_z.weight"
        ][:-1].contiguous()

    rewrite_weights(broken, shrink)
    expect_checkpoint_error(broken, "model.safetensors", "in_proj_z", "shape")


def test_truncated_safetensors(broken: Path):
    path = broken / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    expect_checkpoint_error(broken, "model.safetensors", "corrupt")


def test_garbage_safetensors_header(broken: Path):
    path = broken / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:16] = b"\xff" * 8
    path.write_bytes(bytes(data))
    expect_checkpoint_error(broken, "model.safetensors", "corrupt")


def test_missing_shard_is_named(tmp_path: Path, wrapper_checkpoint: Path):
    copy = Path(shutil.copytree(wrapper_checkpoint, tmp_path / "wrapped"))
    (copy / "model-00002-of-00002.safetensors").unlink()
    expect_checkpoint_error(copy, "model-00002-of-00002.safetensors", "missing")


def test_config_without_architectures_falls_back_to_model_type(tmp_path: Path, dense_checkpoint: Path):
    raw = json.loads((dense_checkpoint / "config.json").read_text())
    del raw["architectures"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert read_model_config(path).architecture == "Qwen3_5ForCausalLM"


def test_bf16_runs_and_stays_close_to_fp32(dense_checkpoint: Path, dense_model):
    bf16 = load_model(dense_checkpoint, dtype=torch.bfloat16)
    tokens = prompt_tokens(120)
    memory = fresh_memory(bf16)
    assert memory.states.recurrent_planes[0].dtype == torch.float32
    assert memory.kv.k_planes[0].dtype == torch.bfloat16
    lane = memory.lanes(1, 3)[0]
    prefill = bf16.prefill(tokens, 0, lane.table, lane.slot, memory.kv, memory.states)
    decoded = bf16.decode([5], [len(tokens)], [lane.table], [lane.slot], memory.kv, memory.states)[0]
    assert torch.isfinite(prefill).all() and torch.isfinite(decoded).all()
    assert_logits_close(prefill, last_logits(dense_model, tokens), BF16_RTOL, "bf16 prefill vs fp32")


def test_bf16_tracks_transformers_in_bf16(dense_checkpoint: Path):
    """bf16 rounding differs from fp32 by a lot on random weights; against transformers' own bf16 forward
    the gap is only rounding order (measured ~0.04 relative on 300 tokens)."""
    from transformers import Qwen3_5ForCausalLM

    reference = Qwen3_5ForCausalLM.from_pretrained(dense_checkpoint, dtype=torch.bfloat16).eval()
    ours = load_model(dense_checkpoint, dtype=torch.bfloat16)
    tokens = prompt_tokens(120)
    with torch.inference_mode():
        expected = reference(torch.tensor([tokens])).logits[0, -1]
    assert_logits_close(last_logits(ours, tokens), expected, BF16_RTOL, "bf16 vs transformers bf16")
