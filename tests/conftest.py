"""Fixtures shared across test folders: small checkpoints the project builds itself (never downloaded)."""

import os
from pathlib import Path

import pytest
from hypothesis import settings

from hybridcache.tools.make_tiny_model import build_checkpoint

# CI runs the same examples every time (a failure there is reproducible, never a coin toss);
# local runs keep exploring new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def micro_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `micro` preset (byte-level vocabulary, tiny dims), built once per test session."""
    return build_checkpoint(tmp_path_factory.mktemp("micro") / "micro", "micro")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny` preset (Qwen3.5's real vocabulary and chat template; the server's embedded default),
    built once per test session into the same folder the tokenizer and template tests use."""
    from hybridcache.tools.make_tiny_model import ensure_checkpoint

    return ensure_checkpoint(tmp_path_factory.getbasetemp() / "checkpoints" / "tiny-0", "tiny", seed=0)
