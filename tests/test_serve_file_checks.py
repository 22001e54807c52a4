"""`hybridcache serve` refuses unsafe or conflicting files in one line, exit 2, before touching any file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.test_cli import run_cli


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    return {entry.name: (entry.read_bytes(), entry.stat().st_mode) for entry in directory.iterdir()}


@pytest.mark.parametrize(("flags", "flag_named", "fragment"), [
    (["--prefix-cache-file", "{d}/events.log.1", "--event-log", "{d}/events.log"], "--prefix-cache-file",
     "rotated segments"),
    (["--prefix-cache-file", "{d}/events.log", "--event-log", "{d}/events.log"], "--prefix-cache-file",
     "is the event log"),
    (["--event-log", "{d}/shared.log"], "--event-log", "group- or world-writable"),
    (["--api-key-file", "{d}/shared.log"], "--api-key-file", "group- or world-writable"),
])
def test_unsafe_files_are_one_line_exit_2_and_nothing_changes(tmp_path: Path, flags, flag_named, fragment):
    (tmp_path / "events.log").write_bytes(b"previous journal")
    os.chmod(tmp_path / "events.log", 0o600)
    (tmp_path / "shared.log").write_bytes(b"someone else's")
    os.chmod(tmp_path / "shared.log", 0o666)
    before = snapshot(tmp_path)
    result = run_cli("serve", "--port", "0", *(flag.format(d=tmp_path) for flag in flags))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and flag_named in lines[0] and fragment in lines[0], result.stderr
    assert snapshot(tmp_path) == before
