"""make-tiny-model writes Hugging Face Qwen3.5 checkpoints that transformers loads unchanged, and the same
preset and seed always write the same bytes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from hybridcache.tools import make_tiny_model
from hybridcache.tools.make_tiny_model import build_checkpoint, ensure_checkpoint
from hybridcache.tools.tiny_model.presets import PRESETS, config_json, get_preset
from hybridcache.tools.tiny_model.weights import random_weights, weight_specs

transformers = pytest.importorskip("transformers")

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
)


# ---- factories ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def checkpoint_cache(tmp_path_factory) -> Path:
    """One folder per test session where presets are built once (shared by every test module)."""
    return tmp_path_factory.getbasetemp() / "checkpoints"


@pytest.fixture(scope="session")
def micro_dir(checkpoint_cache) -> Path:
    return ensure_checkpoint(checkpoint_cache / "micro-0", "micro", seed=0)


@pytest.fixture(scope="session")
def tiny_dir(checkpoint_cache) -> Path:
    return ensure_checkpoint(checkpoint_cache / "tiny-0", "tiny", seed=0)


def load_hf_model(directory: Path):
    """transformers' reference model and its loading report."""
    model, info = transformers.Qwen3_5ForCausalLM.from_pretrained(
        str(directory), output_loading_info=True, dtype=torch.float32
    )
    return model.eval(), info


def read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(directory / "model.safetensors"), framework="pt") as handle:
        return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118


def hf_reference_shapes(preset_name: str) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of transformers' model for our config (built on the meta device)."""
    config_dict = json.loads(json.dumps(config_json(get_preset(preset_name), "float32", 0)))
    config = transformers.Qwen3_5TextConfig(**config_dict)
    with torch.device("meta"):
        model = transformers.Qwen3_5ForCausalLM(config)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


# ---- named assertions --------------------------------------------------------------------------------


def assert_loaded_cleanly(info: dict) -> None:
    assert info["missing_keys"] == set() and not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info


def assert_same_bytes(first: Path, second: Path) -> None:
    for name in CHECKPOINT_FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), f"{name} differs"


def assert_finite_logits(model, token_ids: list[int], vocab_size: int) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits
    assert logits.shape == (1, len(token_ids), vocab_size)
    assert torch.isfinite(logits).all()
    assert logits.std() > 0
    return logits


# ---- stories -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset_name", sorted(PRESETS))
def test_weight_names_and_shapes_are_exactly_the_ones_transformers_declares(preset_name):
    ours = {spec.name: spec.shape for spec in weight_specs(get_preset(preset_name))}
    assert ours == hf_reference_shapes(preset_name)


def test_micro_checkpoint_loads_in_transformers_without_missing_or_unexpected_weights(micro_dir):
    for name in CHECKPOINT_FILES:
        assert (micro_dir / name).is_file(), name
    model, info = load_hf_model(micro_dir)
    assert_loaded_cleanly(info)
    assert not model.config.tie_word_embeddings  # micro keeps an untied lm_head to exercise that path
    assert_finite_logits(model, [*b"Hello, world!", 256, 257], vocab_size=320)


def test_tiny_checkpoint_loads_in_transformers_with_tied_embeddings_and_finite_logits(tiny_dir):
    model, info = load_hf_model(tiny_dir)
    assert_loaded_cleanly(info)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tiny_dir))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    token_ids = tokenizer(prompt).input_ids
    assert token_ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>") == 248045
    assert_finite_logits(model, token_ids, vocab_size=248320)


def test_config_spells_qwen3_5_text_fields(tiny_dir):
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config["model_type"] == "qwen3_5_text"
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.25
    assert config["eos_token_id"] == 248044
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [248046, 248044]  # <|im_end|>, <|endoftext|>
    hf_config = transformers.AutoConfig.from_pretrained(str(tiny_dir))
    assert hf_config.linear_num_value_heads == 4 and hf_config.head_dim == 32


def test_same_seed_writes_identical_bytes(micro_dir, tmp_path):
    rebuilt = build_checkpoint(tmp_path / "again", "micro", seed=0)
    assert_same_bytes(micro_dir, rebuilt)


def test_tiny_rebuild_is_byte_identical_including_the_derived_tokenizer(tiny_dir, tmp_path):
    rebuilt = build_checkpoint(tmp_path / "again", "tiny", seed=0)
    assert_same_bytes(tiny_dir, rebuilt)


def test_different_seed_writes_different_weights_but_the_same_tokenizer(micro_dir, tmp_path):
    other = build_checkpoint(tmp_path / "seed1", "micro", seed=1)
    ours, theirs = read_tensors(micro_dir), read_tensors(other)
    assert ours.keys() == theirs.keys()
    assert all(not torch.equal(ours[name], theirs[name]) for name in ours)
    assert (micro_dir / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_weights_are_drawn_around_the_values_the_model_expects():
    weights = random_weights(get_preset("tiny"), seed=0, dtype="float32")
    deltanet = "model.layers.0.linear_attn"
    decay = weights[f"{deltanet}.A_log"].exp()
    assert decay.min() >= 0.1 - 1e-6 and decay.max() <= 2.0 + 1e-6
    assert weights[f"{deltanet}.dt_bias"].abs().max() <= 4.0
    assert abs(weights[f"{deltanet}.norm.weight"].mean().item() - 1.0) < 0.1  # plain scale near 1
    assert abs(weights["model.norm.weight"].mean().item()) < 0.1  # zero-centred (model scales by 1 + w)
    assert abs(weights["model.embed_tokens.weight"].std().item() - 0.02) < 0.001


def test_bfloat16_storage_is_recorded_in_config_and_tensors(tmp_path):
    directory = build_checkpoint(tmp_path / "bf16", "micro", seed=0, dtype="bfloat16")
    assert json.loads((directory / "config.json").read_text())["dtype"] == "bfloat16"
    assert {tensor.dtype for tensor in read_tensors(directory).values()} == {torch.bfloat16}


def test_cli_builds_a_checkpoint_and_reports_where(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    make_tiny_model.add_arguments(parser)
    arguments = parser.parse_args([str(tmp_path / "cli"), "--preset", "micro", "--seed", "3"])
    status = make_tiny_model.run(arguments)
    assert status == 0
    assert "micro" in capsys.readouterr().out
    assert (tmp_path / "cli" / "model.safetensors").is_file()


def test_cli_reports_an_unwritable_directory_instead_of_raising(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    parser = argparse.ArgumentParser()
    make_tiny_model.add_arguments(parser)
    assert make_tiny_model.run(parser.parse_args([str(blocker / "inside"), "--preset", "micro"])) == 1
    assert "make-tiny-model" in capsys.readouterr().err


def test_unknown_preset_names_the_known_ones():
    with pytest.raises(ValueError, match="micro, tiny, small"):
        get_preset("huge")


def test_default_model_lives_in_the_user_cache_and_is_built_once(tmp_path, monkeypatch, micro_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    target = make_tiny_model.default_model_dir()
    assert target.parent == tmp_path / "xdg" / "hybridcache" / "models"
    assert target.name.startswith("tiny-")
    # ensure_checkpoint builds once, atomically: no staging folder is left behind, and a second call
    # returns the existing directory without rewriting it.
    built = ensure_checkpoint(tmp_path / "cache" / "m", "micro")
    first_write = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_checkpoint(tmp_path / "cache" / "m", "micro") == built
    assert (built / "model.safetensors").stat().st_mtime_ns == first_write
    assert [path.name for path in (tmp_path / "cache").iterdir()] == ["m"]
    assert_same_bytes(micro_dir, built)


@pytest.mark.slow
def test_small_benchmark_checkpoint_loads_in_transformers_in_bfloat16(tmp_path):
    directory = build_checkpoint(tmp_path / "small", "small", seed=0)
    model, info = transformers.Qwen3_5ForCausalLM.from_pretrained(str(directory), output_loading_info=True)
    assert_loaded_cleanly(info)
    assert model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 24 and model.config.hidden_size == 1024
    with torch.no_grad():
        logits = model(torch.tensor([[9419, 1814, 11, 220]])).logits
    assert torch.isfinite(logits).all()
