"""Inspect a prefix-cache file (--prefix-cache-file) or a cache directory (--cache-dir: its contents
journal folded and every restorable entry verified, see tools/inspect_dir.py).

A file: header and fingerprint, host geometry, counts and bytes by kind, a block depth histogram and the
snapshot table; --tree shows the block tree with chains collapsed, --verify checks every checksum (exit 1
on damage, naming the first bad offset), --json prints the summary for scripts, --plot draws the host-
tier composition and the snapshots' frontier/size, and --decode shows a snapshot's tail or a block's
tokens (as text with --tokenizer). Never loads torch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec

from hybridcache.persistence.cache_file import CacheFileError, CacheFileTables, open_tables
from hybridcache.persistence.file_summary import FileSummary, SnapshotRow, kind_name, summarize, verify_file
from hybridcache.persistence.file_tree import FILE_ROOT, FileTree
from hybridcache.tools.inspect_dir import inspect_directory
from hybridcache.tools.inspect_plot import plot_summary

_TABLE_HEADER = (
    f"  {'id':>6} {'frontier':>9} {'kind':<16} {'hits':>5} {'H':>11} {'bytes':>10} {'path':>5} {'tail':>5}"
    f" {'exact':>5}"
)
SORT_KEYS = ("id", "frontier", "kind", "hits", "h", "bytes", "path")
_SORT_FIELD = {"path": "path_blocks"}


COLUMNS_HELP = """\
the snapshot table, one row per recurrent-state snapshot in the file:
  id        the snapshot's id (for --decode snapshot:ID)
  frontier  the prompt position it resumes at, in tokens (64 * path + tail)
  kind      where it was taken: tap (a ladder point during prefill), boundary (a message or system
            boundary, an explicit breakpoint), endpoint (the end of a request: prompt and output),
            hedge (a few hundred to 2,048 tokens before a prompt end, for an edit of its last
            message; the "of which hedges" line totals their bytes)
  hits      how many requests resumed from it
  H         its host-eviction value (GDSF: L + hits-weighted prefill seconds saved per byte held);
            the host tier evicts the lowest H first
  bytes     its image and tail slabs on the host
  path      whole 64-token blocks from the root to its anchor block (the KV it needs)
  tail      tokens past the last whole block, kept in its tail slab (0..63)
  exact     yes: resuming from it reproduces a cold run bit for bit (its state and every block of its
            path were computed as a cold prefill computes them); no: decode steps produced some of
            it, and only an engine with --inexact-resume resumes from it
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = COLUMNS_HELP
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("file", type=Path, help="the prefix-cache file, or a cache directory (--cache-dir)")
    parser.add_argument("--sort", choices=SORT_KEYS, default="frontier", help="snapshot table order")
    parser.add_argument("--reverse", action="store_true", help="sort descending")
    parser.add_argument("--tree", action="store_true", help="show the block tree, chains collapsed")
    parser.add_argument("--verify", action="store_true", help="check every checksum; exit 1 on damage")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--plot", type=Path, metavar="OUT.png", help="write a PNG (needs matplotlib)")
    parser.add_argument(
        "--decode", metavar="snapshot:ID|node:ID", action="append", default=[], help="show tokens"
    )
    parser.add_argument("--tokenizer", type=Path, metavar="DIR", help="checkpoint dir for --decode text")


def run(args: argparse.Namespace) -> int:
    if args.file.is_dir():  # a cache directory: its contents are always verified
        return inspect_directory(args.file, args.json)
    if args.verify:
        return _verify(args.file, args.json)
    try:
        tables = open_tables(args.file)
    except (OSError, CacheFileError) as error:
        print(f"hybridcache inspect: {args.file}: {error}", file=sys.stderr)
        return 1
    summary = summarize(str(args.file), tables)
    rows = _sorted_rows(summary.snapshots, args.sort, args.reverse)
    if args.json:
        print(msgspec.json.encode(msgspec.structs.replace(summary, snapshots=rows)).decode())
    else:
        print(format_summary(summary, rows))
        if args.tree:
            print("\n".join(tree_lines(FileTree(tables))))
    for request in args.decode:
        code = _decode(tables, request, args.tokenizer)
        if code:
            return code
    if args.plot is not None:
        plot_summary(summary, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _sorted_rows(rows: list[SnapshotRow], key: str, reverse: bool) -> list[SnapshotRow]:
    field = _SORT_FIELD.get(key, key)
    return sorted(rows, key=lambda row: (getattr(row, field), row.id), reverse=reverse)


# ---------------------------------------------------------------------- text
def format_summary(summary: FileSummary, rows: list[SnapshotRow]) -> str:
    """The plain-text report. Pure."""
    saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(summary.saved_unix))
    lines = [
        f"file          {summary.path} ({summary.file_bytes} bytes, format {summary.format_version})",
        f"saved         {saved} at event {summary.saved_seq}",
        "fingerprint",
        *(f"  {name:<20} {value}" for name, value in summary.fingerprint.items()),
        "geometry      " + ", ".join(f"{name} {value}" for name, value in summary.geometry.items()),
        f"host tier     {_mib(summary.host_bytes_needed)} needed to restore everything",
        "kind          count        bytes",
        *(f"  {name:<10} {t.count:>7} {_mib(t.bytes):>12}" for name, t in summary.kinds.items()),
        f"  of which hedges {summary.hedges.count} snapshots, {_mib(summary.hedges.bytes)} "
        "(images and tails)",
        f"inexact       {summary.inexact_blocks} blocks, {summary.inexact_snapshots} snapshots "
        "(from decode steps: resumed from only with --inexact-resume)",
        "block depths  " + _histogram(summary.block_depths),
        f"snapshots     {len(rows)}",
        _TABLE_HEADER,
    ]
    lines += [
        f"  {r.id:>6} {r.frontier:>9} {r.kind:<16} {r.hits:>5} {r.h:>11.4g} {r.bytes:>10} "
        f"{r.path_blocks:>5} {r.tail_tokens:>5} {'yes' if r.exact else 'no':>5}"
        for r in rows
    ]
    return "\n".join(lines)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def _histogram(depths: dict[int, int], buckets: int = 8) -> str:
    """Blocks per depth range, e.g. ``0-3:12 4-7:9``. Pure."""
    if not depths:
        return "(no blocks)"
    deepest = max(depths)
    width = max(1, -(-(deepest + 1) // buckets))
    counts: dict[int, int] = {}
    for depth, count in depths.items():
        counts[depth // width] = counts.get(depth // width, 0) + count
    return " ".join(f"{b * width}-{min(deepest, b * width + width - 1)}:{counts[b]}" for b in sorted(counts))


def tree_lines(tree: FileTree) -> list[str]:
    """The block tree, one line per chain of single-child blocks, snapshots under their anchor. Pure."""
    lines = ["root"]
    lines += [
        f"  * snapshot {s.snapshot} @{tree.frontier(s)} {kind_name(s.kind)}" for s in _at(tree, FILE_ROOT)
    ]
    stack = [(child, 1) for child in reversed(tree.children[FILE_ROOT])]
    while stack:
        first, level = stack.pop()
        last, count = first, 1
        while len(tree.children[last]) == 1 and not _at(tree, last):
            last = tree.children[last][0]
            count += 1
        start = 64 * tree.depth[first]
        span = f"block {first}" if count == 1 else f"blocks {first}..{last} ({count} blocks)"
        lines.append(f"{'  ' * level}- {span} tokens {start}..{64 * (tree.depth[last] + 1)}")
        indent = "  " * (level + 1)
        for snap in _at(tree, last):
            kind = kind_name(snap.kind)
            lines.append(f"{indent}* snapshot {snap.snapshot} @{tree.frontier(snap)} {kind} hits={snap.hits}")
        stack.extend((child, level + 1) for child in reversed(tree.children[last]))
    return lines


def _at(tree: FileTree, node: int):
    return tree.snapshots_at.get(node, [])


# ---------------------------------------------------------------------- verify / decode
def _verify(path: Path, as_json: bool) -> int:
    try:
        result = verify_file(path)
    except OSError as error:
        print(f"hybridcache inspect: {path}: {error}", file=sys.stderr)
        return 1
    if as_json:
        damaged = [d._asdict() for d in result.damaged_runs]
        error = None if result.tables_error is None else str(result.tables_error)
        report = {"ok": result.ok, "first_bad_offset": result.first_bad_offset, "tables_error": error}
        print(
            msgspec.json.encode(
                {**report, "damaged_runs": damaged, "runs_checked": result.runs_checked}
            ).decode()
        )
    elif result.ok:
        print(f"ok: tables and {result.runs_checked} slab runs verified")
    elif result.tables_error is not None:
        print(f"damaged at byte {result.first_bad_offset}: {result.tables_error}")
    else:
        bad = len(result.damaged_runs)
        print(f"damaged at byte {result.first_bad_offset}: {bad} slab runs fail their checksum")
        for damage in result.damaged_runs:
            print(f"  {damage.kind} {damage.id} at byte {damage.offset}")
    return 0 if result.ok else 1


def _decode(tables: CacheFileTables, request: str, tokenizer_dir: Path | None) -> int:
    kind, _, raw_id = request.partition(":")
    tree = FileTree(tables)
    snapshots = {s.snapshot: s for s in tables.snapshots}
    if not raw_id.isdigit() or kind not in ("snapshot", "node"):
        print(f"hybridcache inspect: --decode wants snapshot:ID or node:ID, got {request!r}", file=sys.stderr)
        return 2
    entry = int(raw_id)
    if kind == "snapshot" and entry in snapshots:
        ids, what = list(snapshots[entry].tail_tokens), f"snapshot {entry} tail"
    elif kind == "node" and entry in tree.blocks:
        ids, what = list(tree.blocks[entry].tokens), f"node {entry}"
    else:
        print(f"hybridcache inspect: no {kind} {entry} in the file", file=sys.stderr)
        return 1
    print(f"{what} ({len(ids)} tokens): {ids}")
    if tokenizer_dir is not None:
        from hybridcache.core.tokenizer import Tokenizer

        print(repr(Tokenizer.from_dir(tokenizer_dir).decode(ids)))
    return 0
