"""Session fixtures for the model-runtime tests: tiny checkpoints built with transformers, loaded once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from hybridcache.gpu.model import Qwen35Model, load_model

# The suite runs with --import-mode=importlib, which leaves sys.path alone; the model tests share factories
# from model_testkit.py beside this file, so make this folder importable (once).
if str(Path(__file__).parent) not in sys.path:
    sys.path.append(str(Path(__file__).parent))


@pytest.fixture(scope="session")
def dense_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3_5ForCausalLM (4 layers, 3:1 linear:full, untied lm_head), saved by transformers."""
    from model_testkit import build_reference_checkpoint  # imports transformers: only when needed

    return build_reference_checkpoint(tmp_path_factory.mktemp("dense") / "ckpt")


@pytest.fixture(scope="session")
def moe_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3_5MoeForCausalLM (8 experts, top-2, shared expert), saved by transformers."""
    from model_testkit import build_reference_checkpoint

    return build_reference_checkpoint(tmp_path_factory.mktemp("moe") / "ckpt", moe=True, seed=1)


@pytest.fixture(scope="session")
def wrapper_checkpoint(tmp_path_factory: pytest.TempPathFactory, dense_checkpoint: Path) -> Path:
    """The dense checkpoint in the multimodal wrapper's naming, sharded, with vision and mtp weights."""
    from model_testkit import rewrite_as_multimodal_wrapper

    return rewrite_as_multimodal_wrapper(dense_checkpoint, tmp_path_factory.mktemp("wrapper") / "ckpt")


@pytest.fixture(scope="session")
def dense_model(dense_checkpoint: Path) -> Qwen35Model:
    return load_model(dense_checkpoint)


@pytest.fixture(scope="session")
def moe_model(moe_checkpoint: Path) -> Qwen35Model:
    return load_model(moe_checkpoint)


@pytest.fixture(scope="session")
def dense_reference(dense_checkpoint: Path) -> torch.nn.Module:
    from model_testkit import load_reference

    return load_reference(dense_checkpoint)


@pytest.fixture(scope="session")
def moe_reference(moe_checkpoint: Path) -> torch.nn.Module:
    from model_testkit import load_reference

    return load_reference(moe_checkpoint)
