"""The `hybridcache` command: argparse sub-commands, each implemented by a module loaded on demand.

A command module exposes `add_arguments(parser)` and `run(args) -> int`. Commands whose module is
`None` are not built yet: they say so and exit 2, and their help says so too.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
from collections.abc import Sequence
from typing import NamedTuple, NoReturn

from hybridcache import __version__

NOT_IMPLEMENTED_EXIT = 2
USAGE_ERROR_EXIT = 2  # argparse's own exit code for usage errors
TOP_LEVEL_OPTIONS = ("-h", "--help", "--version")


class Command(NamedTuple):
    name: str
    summary: str
    module: str | None  # dotted path of the module with add_arguments/run; None = not built yet


COMMANDS = (
    Command(
        "serve", "serve a model over OpenAI- and Anthropic-compatible HTTP", "hybridcache.http.serve_command"
    ),
    Command(
        "cluster",
        "N local serve replicas behind one cache-aware router (vllm-router or sglang-router)",
        "hybridcache.http.cluster_command",
    ),
    Command("inspect", "inspect a prefix-cache file", "hybridcache.tools.inspect"),
    Command("replay", "replay an event log into a fresh index and check it", "hybridcache.tools.replay"),
    Command("simulate", "simulate the prefix cache on agent traces (no model)", "hybridcache.tools.simulate"),
    Command(
        "make-tiny-model",
        "write a deterministic random-weight Qwen3.5 checkpoint",
        "hybridcache.tools.make_tiny_model",
    ),
)

BENCHMARKS = (
    Command(
        "index", "prefix index: match, insert, events/s, eviction planning", "hybridcache.tools.bench_index"
    ),
    Command(
        "model", "model runtime vs transformers: prefill and decode tok/s", "hybridcache.tools.bench_model"
    ),
    Command("engine", "engine: cold vs resumed TTFT, cache overhead", "hybridcache.tools.bench_engine"),
    Command(
        "exact", "resumed vs cold logprobs from every resume source", "hybridcache.tools.bench_exact"
    ),
    Command("serve", "HTTP server throughput and latency, cache on vs off", "hybridcache.tools.bench_serve"),
    Command(
        "persistence",
        "prefix-cache file save/load vs raw disk, journal overhead",
        "hybridcache.tools.bench_persistence",
    ),
    Command("trace", "replay a trace against live servers, cache on vs off", "hybridcache.tools.bench_trace"),
    Command("trace-gen", "generate a deterministic JSONL trace for live runs", "hybridcache.tools.trace_gen"),
    Command("peer", "beside llama.cpp's llama-server: prefill, decode, RSS, bandwidth limit",
            "hybridcache.tools.bench_peer"),
    Command("soak", "C clients of mixed traffic for M minutes against serve; leaks, RSS, stalls",
            "hybridcache.tools.bench_soak"),
    Command("crash-trials", "kill -9 a serve --cache-dir at random moments; check what a restart gives back",
            "hybridcache.tools.crash_trials"),
    Command("cache-dir", "what --cache-dir costs per request, and its fsync batches",
            "hybridcache.tools.bench_cache_dir"),
    Command("gpu", "GPU tests and benchmarks on a CUDA device", None),
)


class OneLineErrorParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line naming the command and pointing at --help
    (the full usage of `serve` is a screen long and hides the error). Sub-parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR_EXIT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser for `argv`: only the command named in it loads its module (so --help stays fast)."""
    words = [word for word in argv if not word.startswith("-")]
    selected = words[0] if words else None
    bench_selected = words[1] if selected == "bench" and len(words) > 1 else None
    parser = OneLineErrorParser(
        prog="hybridcache",
        description="An inference server for hybrid (Qwen3.5) models with an exact hybrid prefix cache.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"hybridcache {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        _add_command(commands, command, load=command.name == selected)
    bench = commands.add_parser(
        "bench",
        allow_abbrev=False,
        help="benchmarks that print name=value lines",
        description=(
            "Benchmarks. Each prints one name=value per line, with ratios measured side by side in one run."
        ),
    )
    kinds = bench.add_subparsers(dest="bench_kind", metavar="KIND", required=True)
    for command in BENCHMARKS:
        _add_command(kinds, command, load=command.name == bench_selected)
    return parser


def _add_command(subparsers: argparse._SubParsersAction, command: Command, load: bool) -> None:
    if command.module is None:
        sub = subparsers.add_parser(
            command.name,
            allow_abbrev=False,
            help=f"{command.summary} (not implemented yet)",
            description=f"{command.summary}. Not implemented yet: this command exits {NOT_IMPLEMENTED_EXIT}.",
        )
        sub.add_argument("arguments", nargs=argparse.REMAINDER, help="ignored until the command is built")
        sub.set_defaults(handler=_not_implemented(command.name))
        return
    if not load:
        subparsers.add_parser(
            command.name, allow_abbrev=False, help=command.summary, description=command.summary
        )
        return
    module = importlib.import_module(command.module)
    sub = subparsers.add_parser(
        command.name, allow_abbrev=False, help=command.summary, description=_describe(module, command)
    )
    module.add_arguments(sub)
    sub.set_defaults(handler=module.run, command_parser=sub)


def _describe(module: object, command: Command) -> str:
    doc = (getattr(module, "__doc__", None) or "").strip()
    return doc or command.summary


def _not_implemented(name: str):
    def handler(args: argparse.Namespace) -> int:
        print(f"hybridcache: '{name}' is not implemented yet", file=sys.stderr)
        return NOT_IMPLEMENTED_EXIT

    return handler


def unknown_arguments_message(unknown: Sequence[str], parser: argparse.ArgumentParser) -> str:
    """'unrecognized arguments: ...', naming the closest flag when one is near (flags are never
    abbreviated, so `--prefix-cache` is an error, not `--prefix-cache-file`). Pure."""
    message = "unrecognized arguments: " + " ".join(unknown)
    flags = [flag for action in parser._actions for flag in action.option_strings]
    for word in unknown:
        close = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.6)
        if word.startswith("--") and close:
            return f"{message}; did you mean {close[0]}? (flags are never abbreviated)"
    return message


def misplaced_options_hint(argv: Sequence[str]) -> str | None:
    """A hint when options come before the sub-command (``hybridcache --port 8001 serve``), else None.

    Only `--help` and `--version` belong before the sub-command; argparse alone would report the option's
    value as an invalid command. Pure.
    """
    if not argv or not argv[0].startswith("-") or argv[0] in TOP_LEVEL_OPTIONS:
        return None
    names = {command.name for command in COMMANDS} | {"bench"}
    at = next((i for i, word in enumerate(argv) if word in names), None)
    if at is None:
        return "put options after the sub-command: hybridcache COMMAND [options] (see hybridcache --help)"
    words = list(argv[at:at + 1])
    if argv[at] == "bench" and at + 1 < len(argv) and not argv[at + 1].startswith("-"):
        words.append(argv[at + 1])
    rest = [*argv[:at], *argv[at + len(words):]]
    return "put options after the sub-command: " + " ".join(["hybridcache", *words, *rest])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    hint = misplaced_options_hint(argv)
    if hint is not None:
        print(f"hybridcache: error: {hint}", file=sys.stderr)
        return USAGE_ERROR_EXIT
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command_parser = getattr(args, "command_parser", parser)
        command_parser.error(unknown_arguments_message(unknown, command_parser))
    return int(args.handler(args) or 0)
