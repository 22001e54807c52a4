"""`hybridcache inspect`: text, --json, --tree, --sort, --decode, --plot and --verify exit codes on a saved
prefix-cache file (built by the persistence factories), and no torch import for plain inspection."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
for _folder in (_TESTS / "persistence", _TESTS / "cache"):  # shared factories (importlib import mode)
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from persistence_factories import conversation_state, save  # noqa: E402

from hybridcache.persistence.cache_file import FORMAT_VERSION, open_tables  # noqa: E402
from hybridcache.tools import inspect  # noqa: E402


@pytest.fixture(scope="module")
def cache_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = conversation_state(seed=41)
    path = tmp_path_factory.mktemp("inspect") / "cache.bin"
    save(path, state.cache, state.memory)
    return path


def inspect_cli(capsys, *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    inspect.add_arguments(parser)
    code = inspect.run(parser.parse_args([str(a) for a in argv]))
    out, err = capsys.readouterr()
    return code, out, err


def flipped_copy(path: Path, directory: Path, offset: int) -> Path:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    copy = directory / "damaged.bin"
    copy.write_bytes(bytes(data))
    return copy


def test_text_output_shows_header_geometry_kinds_depths_and_every_snapshot(cache_file: Path, capsys):
    code, out, _ = inspect_cli(capsys, cache_file)
    tables = open_tables(cache_file)
    assert code == 0
    for expected in (
        f"format {FORMAT_VERSION}",
        "checkpoint_path",
        "/models/qwen3.5-test",
        "slab_bytes 4096",
        "block depths",
    ):
        assert expected in out
    assert f"blocks     {len(tables.blocks):>7}" in out
    assert f"snapshots     {len(tables.snapshots)}" in out


def test_json_output_carries_the_same_summary(cache_file: Path, capsys):
    code, out, _ = inspect_cli(capsys, cache_file, "--json", "--sort", "hits", "--reverse")
    summary = json.loads(out)
    tables = open_tables(cache_file)
    assert code == 0
    assert summary["kinds"]["blocks"]["count"] == len(tables.blocks)
    assert summary["kinds"]["images"]["bytes"] == len(tables.snapshots) * 3 * 4096
    assert sum(summary["block_depths"].values()) == len(tables.blocks)
    hits = [row["hits"] for row in summary["snapshots"]]
    assert hits == sorted(hits, reverse=True) and len(hits) == len(tables.snapshots)
    assert {row["id"] for row in summary["snapshots"]} == {s.snapshot for s in tables.snapshots}


def test_sort_orders_the_snapshot_table(cache_file: Path, capsys):
    _, out, _ = inspect_cli(capsys, cache_file, "--sort", "frontier")
    table = out.split(" exact\n", 1)[1].strip().splitlines()  # after the table's header
    frontiers = [int(line.split()[1]) for line in table]
    assert frontiers == sorted(frontiers) and len(frontiers) == len(open_tables(cache_file).snapshots)


def test_tree_collapses_chains_and_lists_every_snapshot_under_its_anchor(cache_file: Path, capsys):
    _, out, _ = inspect_cli(capsys, cache_file, "--tree")
    tree = out.split("\nroot\n", 1)[1]
    tables = open_tables(cache_file)
    assert tree.count("* snapshot") == len(tables.snapshots)
    block_lines = [line for line in tree.splitlines() if line.strip().startswith("- block")]
    assert len(block_lines) < len(tables.blocks)  # chains are collapsed
    assert any("blocks" in line and "blocks)" in line for line in block_lines)


def test_decode_shows_a_snapshot_tail_and_a_node_s_tokens(cache_file: Path, capsys):
    tables = open_tables(cache_file)
    snap, block = tables.snapshots[0], tables.blocks[0]
    code, out, _ = inspect_cli(
        capsys, cache_file, "--decode", f"snapshot:{snap.snapshot}", "--decode", f"node:{block.node}"
    )
    assert code == 0
    assert f"snapshot {snap.snapshot} tail ({len(snap.tail_tokens)} tokens): {list(snap.tail_tokens)}" in out
    assert f"node {block.node} (64 tokens): {list(block.tokens)}" in out
    code, _, err = inspect_cli(capsys, cache_file, "--decode", "snapshot:99999")
    assert code == 1 and "no snapshot 99999" in err


def test_decode_with_a_tokenizer_prints_text(cache_file: Path, capsys, micro_checkpoint: Path):
    from hybridcache.core.tokenizer import Tokenizer

    block = open_tables(cache_file).blocks[0]
    code, out, _ = inspect_cli(
        capsys, cache_file, "--decode", f"node:{block.node}", "--tokenizer", micro_checkpoint
    )
    assert code == 0
    assert repr(Tokenizer.from_dir(micro_checkpoint).decode(list(block.tokens))) in out


def test_verify_passes_on_an_intact_file(cache_file: Path, capsys):
    code, out, _ = inspect_cli(capsys, cache_file, "--verify")
    assert code == 0 and out.startswith("ok:")


def test_verify_exits_1_with_the_first_bad_offset_of_a_damaged_slab(cache_file: Path, tmp_path: Path, capsys):
    tables = open_tables(cache_file)
    run_start = tables.data_start + tables.snapshots[0].offset
    damaged = flipped_copy(cache_file, tmp_path, run_start + 10)
    code, out, _ = inspect_cli(capsys, damaged, "--verify", "--json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    assert report["first_bad_offset"] == run_start
    assert report["damaged_runs"] == [
        {"kind": "snapshot", "id": tables.snapshots[0].snapshot, "offset": run_start}
    ]


def test_verify_exits_1_on_a_damaged_table_and_plain_inspect_refuses_it(
    cache_file: Path, tmp_path: Path, capsys
):
    damaged = flipped_copy(cache_file, tmp_path, 40)
    code, out, _ = inspect_cli(capsys, damaged, "--verify")
    assert code == 1 and out.startswith("damaged at byte 16")
    code, _, err = inspect_cli(capsys, damaged)
    assert code == 1 and "checksum mismatch" in err


def test_plot_writes_a_png(cache_file: Path, tmp_path: Path, capsys):
    out_png = tmp_path / "cache.png"
    code, out, _ = inspect_cli(capsys, cache_file, "--plot", out_png)
    assert code == 0 and f"wrote {out_png}" in out
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plain_inspection_never_imports_torch(cache_file: Path):
    script = (
        "import sys, argparse\n"
        "from hybridcache.tools import inspect\n"
        "p = argparse.ArgumentParser(); inspect.add_arguments(p)\n"
        f"code = inspect.run(p.parse_args([{str(cache_file)!r}, '--tree', '--verify']))\n"
        f"code += inspect.run(p.parse_args([{str(cache_file)!r}, '--json']))\n"
        "assert code == 0, code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_hedges_are_listed_with_their_bytes(tmp_path: Path, capsys):
    from cache_factories import checked_cache, flush_and_land, geometry, run_request, tokens
    from persistence_factories import fill_slabs

    from hybridcache.gpu.host_tier import HostSlabMemory

    cache = checked_cache(geometry(num_pages=96, host_slabs=256, concurrency=2, snapshot_slots=4))
    memory = HostSlabMemory(cache.index.host)
    run_request(cache, tokens(300, seed=5), generated=tokens(20, seed=6), hedges=[128])
    flush_and_land(cache)  # as the engine's stop before a save: the hedge's path goes to the host
    fill_slabs(cache, memory, 5)
    path = tmp_path / "hedged.bin"
    save(path, cache, memory)
    code, out, _ = inspect_cli(capsys, path, "--json")
    summary = json.loads(out)
    assert code == 0
    assert summary["hedges"] == {"count": 1, "bytes": 3 * 4096}
    assert [row["kind"] for row in summary["snapshots"]].count("hedge") == 1
    code, out, _ = inspect_cli(capsys, path)
    assert "of which hedges 1 snapshots, 0.01 MiB" in out
    assert " hedge " in out
