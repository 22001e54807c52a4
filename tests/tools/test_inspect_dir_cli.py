"""`hybridcache inspect DIR` and `hybridcache replay DIR` on a cache directory written by a micro engine."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from hybridcache.cache.records import SnapshotKind
from hybridcache.core.frontend import Frontend
from hybridcache.persistence.cache_dir import contents_path, slabs_path
from hybridcache.persistence.contents_file import read_contents
from hybridcache.tools import inspect, replay
from tests.core.engine_kit import filler_tokens, generate, start_engine


@pytest.fixture
async def cache_dir(micro_checkpoint: Path, tmp_path: Path) -> Path:
    directory = tmp_path / "cache"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, cache_dir=str(directory))
    history = filler_tokens(300, seed=3)
    for turn in range(3):
        history = history + (await generate(engine, frontend.prepare_tokens(history), 8)).tokens
        history = history + filler_tokens(150, seed=turn)
    await engine.stop()
    return directory


def cli(module, capsys, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    code = module.run(parser.parse_args([str(a) for a in argv]))
    out, _ = capsys.readouterr()
    return code, out


def test_inspect_and_replay_read_the_directory(cache_dir: Path, capsys):
    fold = read_contents(contents_path(cache_dir)).fold
    code, out = cli(inspect, capsys, cache_dir)
    assert code == 0
    assert f"listed        {len(fold.images)} snapshots" in out and "0 failed their checksum" in out
    code, out = cli(replay, capsys, cache_dir, "--json")
    report = json.loads(out)
    assert code == 0 and report["records"]["BlockStored"] == len(fold.blocks)
    assert report["check"]["restorable_snapshots"] == len(fold.images)


def test_a_damaged_slab_makes_both_exit_1_naming_the_entry(cache_dir: Path, tmp_path: Path, capsys):
    damaged = tmp_path / "damaged"
    shutil.copytree(cache_dir, damaged)
    fold = read_contents(contents_path(damaged)).fold
    slab = next(iter(fold.blocks.values())).slab
    slab_bytes = read_contents(contents_path(damaged)).header.geometry.slab_bytes
    with open(slabs_path(damaged), "r+b") as stream:
        stream.seek(slab * slab_bytes + 7)
        stream.write(b"\xff\xfe")
    code, out = cli(inspect, capsys, damaged)
    assert code == 1 and f"(slab {slab})" in out
    code, out = cli(replay, capsys, damaged)
    assert code == 1 and "1 failed their checksum" in out


def test_a_directory_without_contents_is_exit_2(tmp_path: Path, capsys):
    code, _ = cli(inspect, capsys, tmp_path)
    assert code == 2


def test_inspect_totals_the_hedges_it_lists(cache_dir: Path, capsys):
    """The hedge images of the directory, each a whole number of slabs (a hedge sits on the block grid,
    so it has no tail page), appear on the "of which hedges" line and in --json."""
    contents = read_contents(contents_path(cache_dir))
    geometry = contents.header.geometry
    hedges = [image for image in contents.fold.images.values() if image.kind == SnapshotKind.HEDGE]
    assert hedges, "the fixture's prompts are long enough to be hedged"
    assert all(not image.tail_tokens for image in hedges)
    image_slabs = -(-geometry.image_bytes // geometry.slab_bytes)
    total = len(hedges) * image_slabs * geometry.slab_bytes
    code, out = cli(inspect, capsys, cache_dir)
    assert code == 0
    assert f"  of which hedges {len(hedges)} snapshots, {total / 2**20:.2f} MiB (images and tails)" in out
    code, out = cli(inspect, capsys, cache_dir, "--json")
    report = json.loads(out)
    assert (report["listed_hedges"], report["listed_hedge_bytes"]) == (len(hedges), total)
