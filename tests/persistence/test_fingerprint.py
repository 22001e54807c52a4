"""The fingerprint changes with the checkpoint, the options and the program; equal inputs, equal prints."""

from __future__ import annotations

import os
from pathlib import Path

from hybridcache.persistence.fingerprint import build_identity, fingerprint_differences, make_fingerprint


def checkpoint(directory: Path) -> Path:
    directory.mkdir()
    (directory / "config.json").write_text('{"hidden_size": 8}')
    (directory / "model.safetensors").write_bytes(b"\0" * 100)
    return directory


def fingerprint_of(path: Path, **changes):
    options = {"model_config": {"hidden_size": 8}, "dtype": "bfloat16", "kv_layout": "paged", "rope": {}}
    options.update(changes)
    return make_fingerprint(path, prefill_signature="chunk-64", **options)


def test_equal_inputs_give_equal_fingerprints(tmp_path: Path):
    path = checkpoint(tmp_path / "model")
    first, second = fingerprint_of(path), fingerprint_of(path)
    assert first == second and fingerprint_differences(first, second) == []
    assert first.checkpoint_path == str(path.resolve()) and first.checkpoint_bytes == 118


def test_touching_or_growing_the_checkpoint_changes_it(tmp_path: Path):
    path = checkpoint(tmp_path / "model")
    before = fingerprint_of(path)
    os.utime(path / "model.safetensors", ns=(1, before.checkpoint_mtime_ns + 10**9))
    touched = fingerprint_of(path)
    (path / "model.safetensors").write_bytes(b"\0" * 101)
    assert fingerprint_differences(before, touched) == ["checkpoint_mtime_ns"]
    assert "checkpoint_bytes" in fingerprint_differences(touched, fingerprint_of(path))


def test_options_change_their_own_field(tmp_path: Path):
    path = checkpoint(tmp_path / "model")
    base = fingerprint_of(path)
    assert fingerprint_differences(base, fingerprint_of(path, dtype="float16")) == ["dtype"]
    assert fingerprint_differences(base, fingerprint_of(path, rope={"theta": 1})) == ["rope"]
    assert fingerprint_differences(base, fingerprint_of(path, model_config={"hidden_size": 9})) == [
        "model_config_hash"
    ]


def test_the_build_identity_follows_the_sources(tmp_path: Path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    before = build_identity(package)
    (package / "a.py").write_text("x = 2\n")
    assert build_identity(package) != before and len(before) == 16
