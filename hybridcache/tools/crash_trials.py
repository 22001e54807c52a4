"""Crash trials for `--cache-dir`: kill -9 a live `hybridcache serve` and check what its restart gives back.

    python -m hybridcache.tools.crash_trials --trials 20 [--preset tiny] [--conversations 4 --turns 3]

1. Reference: every turn of every conversation is answered greedily under a cache salt of its own (so
   nothing is reused: the cold outputs), which also fixes each later turn's prompt (the history holds
   the reference replies).
2. Orderly figure: the same server (a fresh cache directory) replays the conversations unsalted, stops
   with SIGTERM, restarts; repeating each conversation's last prompt reports `cached_tokens`.
3. Each trial: a fresh directory, a server (contents compacted every few records, so compactions are
   frequent), the conversations replayed concurrently while `/v1/cache/stats` is polled, then `kill -9`
   after a random number of replies plus a random delay, refined by the trial's mode: `random` (then),
   `mid-write` (at the next growth of the contents file: a batch between its write and its fsync or just
   past it), `mid-compaction` (while the next compaction's temporary file exists) or `mid-stop`
   (SIGTERM, then kill -9 a random 0-300 ms later). Then a restart in the same directory: it must start; every
   conversation that finished before the last durable point (a stats poll after its last reply showed
   `cache_dir_durable_seq` at or past the event sequence seen right after it) must report at least 90 %
   of its orderly figure when its last prompt is repeated, and every repeated reply must equal the cold
   one. The restore time (fold + verify, from the stats) is shown beside a plain read of the same slab
   bytes.

Exit status 0 when every trial passed. `run_trials()` is the library form (the tests call it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from hybridcache.persistence.cache_dir import contents_path, slabs_path
from hybridcache.persistence.contents_file import read_contents, temporary_name
from hybridcache.tools.serve_launch import MODEL, ServeProcess

MODES = ("random", "mid-write", "mid-compaction", "mid-stop")
REUSE_SHARE = 0.9


@dataclass
class TrialSettings:
    checkpoint: Path
    workdir: Path
    trials: int = 20
    conversations: int = 4
    turns: int = 3
    words_per_turn: int = 150
    max_tokens: int = 8
    seed: int = 0
    compact_min_tail: int = 8
    host_cache_mib: int = 64
    kv_pages: int = 256
    lanes: int = 4
    modes: tuple[str, ...] = MODES


@dataclass
class TrialResult:
    number: int
    mode: str
    kill_at_s: float
    mid_compaction: bool
    started: bool
    start_seconds: float = 0.0
    restore_seconds: float = 0.0
    plain_read_seconds: float = 0.0
    verified_bytes: int = 0
    torn_bytes: int = 0
    mismatched: int = 0
    restored_snapshots: int = 0
    finished: int = 0
    durable: int = 0
    reuse_ok: int = 0
    wrong_replies: int = 0
    shortfalls: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.started and not self.wrong_replies and self.reuse_ok == self.durable


def _user_text(conversation: int, turn: int, words: int, seed: int) -> str:
    rng = random.Random(f"{seed}/{conversation}/{turn}")
    return " ".join(f"{rng.choice(('alpha', 'beta', 'gamma', 'delta', 'omega'))}{rng.randrange(1000)}"
                    for _ in range(words))


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str, max_tokens: int) -> None:
        self.session = session
        self.url = url
        self.max_tokens = max_tokens

    async def chat(self, messages: list[dict[str, str]], salt: str | None = None) -> tuple[str, int]:
        body = {"model": MODEL, "messages": messages, "max_tokens": self.max_tokens, "temperature": 0}
        if salt is not None:
            body["cache_salt"] = salt
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as response:
            data = await response.json()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {data}")
        cached = data["usage"]["prompt_tokens_details"]["cached_tokens"]
        return data["choices"][0]["message"]["content"], cached

    async def stats(self) -> dict[str, object]:
        async with self.session.get(self.url + "/v1/cache/stats") as response:
            return await response.json()


def _launch(settings: TrialSettings, directory: Path, compact: bool = False) -> tuple[ServeProcess, float]:
    argv = [sys.executable, "-m", "hybridcache", "serve", "--host", "127.0.0.1", "--port", "0",
            "--model", str(settings.checkpoint), "--served-model-name", MODEL, "--device", "cpu",
            "--max-concurrency", str(settings.lanes), "--kv-capacity", str(settings.kv_pages),
            "--host-cache-mib", str(settings.host_cache_mib), "--cache-dir", str(directory)]
    env = dict(os.environ)
    if compact:
        env["HYBRIDCACHE_COMPACT_MIN_TAIL"] = str(settings.compact_min_tail)
        env["HYBRIDCACHE_COMPACT_TAIL_RATIO"] = "0.25"
        env["HYBRIDCACHE_COMPACTION_PAUSE_S"] = "0.05"  # a window the watcher can see and kill in
    started = time.monotonic()
    # A real failed start exits at once (its stderr closes); the long limit only covers a paused machine.
    server = ServeProcess.launch_argv(argv, startup_timeout_s=1800, env=env)
    return server, time.monotonic() - started


def _conversation_prompts(settings: TrialSettings, replies: list[list[str]]) -> list[list[list[dict]]]:
    """prompts[c][t]: the messages of turn t of conversation c (earlier replies from the reference)."""
    prompts = []
    for c in range(settings.conversations):
        history: list[dict[str, str]] = []
        turns = []
        for t in range(settings.turns):
            text = _user_text(c, t, settings.words_per_turn, settings.seed)
            history = [*history, {"role": "user", "content": text}]
            turns.append(history)
            if t < len(replies[c]):
                history = [*history, {"role": "assistant", "content": replies[c][t]}]
        prompts.append(turns)
    return prompts


async def _reference(settings: TrialSettings, client: Client) -> list[list[str]]:
    """The cold greedy reply of every turn: each request under a cache salt of its own, so none reuses
    anything (and none is reused by the unsalted replays)."""
    replies: list[list[str]] = [[] for _ in range(settings.conversations)]
    for t in range(settings.turns):
        prompts = _conversation_prompts(settings, replies)
        for c in range(settings.conversations):
            reply, cached = await client.chat(prompts[c][t], salt=f"reference-{c}-{t}")
            if cached:
                raise RuntimeError(f"the reference request {c}/{t} reused {cached} tokens")
            replies[c].append(reply)
    return replies


async def _replay(
    client: Client, prompts: list[list[list[dict]]], finished: dict[int, float], replies_seen: list[int]
) -> None:
    async def one(c: int) -> None:
        for messages in prompts[c]:
            await client.chat(messages)
            replies_seen.append(c)
        finished[c] = time.monotonic()

    await asyncio.gather(*(one(c) for c in range(len(prompts))), return_exceptions=True)


async def _repeat_last(client: Client, prompts, replies, conversations) -> dict[int, tuple[bool, int]]:
    """(reply equals the cold one, cached_tokens) of each conversation's last prompt repeated."""
    out = {}
    for c in conversations:
        reply, cached = await client.chat(prompts[c][-1])
        out[c] = (reply == replies[c][-1], cached)
    return out


async def _orderly_figure(settings: TrialSettings):
    """The cold replies (and so the prompts), then the orderly figure: replay, SIGTERM, restart, repeat."""
    directory = settings.workdir / "orderly"
    shutil.rmtree(directory, ignore_errors=True)
    server, _ = _launch(settings, directory)
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(session, server.url, settings.max_tokens)
            replies = await _reference(settings, client)
            prompts = _conversation_prompts(settings, replies)
            started = time.monotonic()
            await _replay(client, prompts, {}, [])
            replay_seconds = time.monotonic() - started
    finally:
        server.stop()
    server, _ = _launch(settings, directory)
    try:
        async with aiohttp.ClientSession() as session:
            repeats = await _repeat_last(Client(session, server.url, settings.max_tokens), prompts, replies,
                                         range(settings.conversations))
    finally:
        server.stop()
    if not all(ok for ok, _ in repeats.values()):
        raise RuntimeError("the orderly restart served a reply that differs from the cold run")
    return prompts, replies, {c: cached for c, (_, cached) in repeats.items()}, replay_seconds


class _FileWatch:
    """Once armed, signals when the contents file grows, or while its compaction's temporary file
    exists."""

    def __init__(self, directory: Path, mode: str) -> None:
        self.contents = contents_path(directory)
        self.temporary = temporary_name(self.contents)
        self.mode = mode
        self.armed = threading.Event()
        self.hit = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = -1
        while not self._stop.is_set() and not self.armed.wait(0.005):
            pass
        while not self._stop.is_set():
            if self.mode == "mid-compaction" and self.temporary.exists():
                self.hit.set()
                return
            if self.mode == "mid-write":
                try:
                    size = self.contents.stat().st_size
                except FileNotFoundError:
                    size = -1
                if last >= 0 and size > last:
                    self.hit.set()
                    return
                last = size
            time.sleep(0.0005)

    def stop(self) -> None:
        self._stop.set()


async def _trial(settings: TrialSettings, number: int, mode: str, prompts, replies, orderly, replay_s, rng):
    directory = settings.workdir / f"trial-{number:02d}"
    shutil.rmtree(directory, ignore_errors=True)
    server, _ = _launch(settings, directory, compact=True)
    finished: dict[int, float] = {}
    polls: list[tuple[float, int, int]] = []
    replies_seen: list[int] = []
    total = settings.conversations * settings.turns
    # The moment is chosen by progress, not by the clock (robust to a slow or paused machine): after a
    # random number of replies (0 .. all of them), a random delay (up to half a replay) later.
    after_replies = rng.randint(0, total)
    delay_s = rng.uniform(0.0, 0.5) * replay_s
    watch = _FileWatch(directory, mode) if mode in ("mid-write", "mid-compaction") else None
    async with aiohttp.ClientSession() as session:
        client = Client(session, server.url, settings.max_tokens)

        async def poll() -> None:
            while True:
                try:
                    stats = await client.stats()
                    polls.append((time.monotonic(), int(stats["cache_event_seq"]),
                                  int(stats["cache_dir_durable_seq"])))
                except (TimeoutError, aiohttp.ClientError, ValueError):
                    return
                await asyncio.sleep(0.05)

        poller = asyncio.create_task(poll())
        replay = asyncio.create_task(_replay(client, prompts, finished, replies_seen))
        started = time.monotonic()
        while len(replies_seen) < after_replies and not replay.done():
            await asyncio.sleep(0.005)
        await asyncio.sleep(delay_s)
        if watch is not None:  # then the next write or compaction, or give up a replay after the end
            watch.armed.set()
            end = None
            while not watch.hit.is_set():
                if replay.done():
                    end = end or time.monotonic()
                    if time.monotonic() > end + replay_s:
                        break
                await asyncio.sleep(0.0005)
        if mode == "mid-stop":
            server.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(rng.uniform(0.0, 0.3))
        mid_compaction = temporary_name(contents_path(directory)).exists()
        server.process.kill()
        kill_time = time.monotonic()
        server.process.wait()
        if watch is not None:
            watch.stop()
        poller.cancel()
        await asyncio.gather(poller, replay, return_exceptions=True)
    mid_compaction = mid_compaction or temporary_name(contents_path(directory)).exists()
    result = TrialResult(number, mode, kill_time - started, mid_compaction, started=False)
    durable = [c for c, at in finished.items() if _durable_before(at, polls, kill_time)]
    result.finished, result.durable = len(finished), len(durable)
    try:
        server, result.start_seconds = _launch(settings, directory)
    except Exception as error:  # a failed start fails the trial
        result.shortfalls.append(f"failed start: {error}")
        return result
    result.started = True
    try:
        async with aiohttp.ClientSession() as session:
            client = Client(session, server.url, settings.max_tokens)
            restored = (await client.stats())["cache_dir_restored"]
            result.restore_seconds = restored["seconds"]
            result.verified_bytes = restored["verified_bytes"]
            result.torn_bytes = restored["torn_bytes"]
            result.mismatched = restored["mismatched"]
            result.restored_snapshots = restored["restored_snapshots"]
            repeats = await _repeat_last(client, prompts, replies, range(settings.conversations))
    finally:
        server.stop()
    result.plain_read_seconds = plain_read_seconds(directory)
    for c, (same, cached) in repeats.items():
        if not same:
            result.wrong_replies += 1
            result.shortfalls.append(f"conversation {c}: reply differs from the cold run")
        if c in durable:
            if cached >= REUSE_SHARE * orderly[c]:
                result.reuse_ok += 1
            else:
                result.shortfalls.append(f"conversation {c}: cached {cached} < 90 % of {orderly[c]}")
    return result


def _durable_before(finished_at: float, polls: list[tuple[float, int, int]], kill_time: float) -> bool:
    """A poll after the conversation's last reply saw event seq S; a later one (before the kill) saw
    every host write up to S durable."""
    after = [(t, seq, durable) for t, seq, durable in polls if finished_at <= t < kill_time]
    if not after:
        return False
    first_seq = after[0][1]
    return any(durable >= first_seq for _, _, durable in after)


def plain_read_seconds(directory: Path) -> float:
    """Seconds to read, with plain preads in slab order, the slab bytes the contents name."""
    contents = read_contents(contents_path(directory))
    fold = contents.fold
    slab_bytes = contents.header.geometry.slab_bytes
    slabs = sorted({b.slab for b in fold.blocks.values()} | {t.slab for t in fold.tails.values()}
                   | {s for image in fold.images.values() for s in image.slabs})
    started = time.perf_counter()
    fd = os.open(slabs_path(directory), os.O_RDONLY)
    try:
        for slab in slabs:
            os.pread(fd, slab_bytes, slab * slab_bytes)
    finally:
        os.close(fd)
    return time.perf_counter() - started


async def run_trials(settings: TrialSettings, report=print) -> list[TrialResult]:
    """Run every trial (see the module docstring); `report` gets one line per step."""
    settings.workdir.mkdir(parents=True, exist_ok=True)
    prompts, replies, orderly, replay_s = await _orderly_figure(settings)
    report(f"orderly-stop figure (cached_tokens of each last prompt repeated): {orderly}; "
           f"replay takes {replay_s:.2f} s")
    rng = random.Random(settings.seed)
    results = []
    for number in range(settings.trials):
        mode = settings.modes[number % len(settings.modes)]
        result = await _trial(settings, number, mode, prompts, replies, orderly, replay_s, rng)
        results.append(result)
        report(_line(result))
    return results


def _line(r: TrialResult) -> str:
    status = "ok  " if r.passed else "FAIL"
    ratio = r.restore_seconds / r.plain_read_seconds if r.plain_read_seconds > 0 else float("nan")
    text = (f"{status} trial {r.number:2d} {r.mode:14s} kill at {r.kill_at_s:5.2f} s"
            f"{' (mid-compaction)' if r.mid_compaction else ''}: finished {r.finished}, durable {r.durable}, "
            f"reuse >= 90 % in {r.reuse_ok}/{r.durable}, wrong replies {r.wrong_replies}; restart "
            f"{r.start_seconds:.1f} s, restore {r.restore_seconds * 1e3:.1f} ms vs plain read "
            f"{r.plain_read_seconds * 1e3:.1f} ms (x{ratio:.1f}) of {r.verified_bytes / 2**20:.1f} MiB; "
            f"torn tail {r.torn_bytes} B, checksum drops {r.mismatched}, snapshots {r.restored_snapshots}")
    if r.shortfalls:
        text += "\n     " + "; ".join(r.shortfalls)
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: built under --workdir")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/hybridcache-crash-trials"))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--conversations", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--words-per-turn", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default=",".join(MODES), help="kill modes, cycled over the trials")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")


def main(argv: list[str] | None = None) -> int:
    """`python -m hybridcache.tools.crash_trials` (also `hybridcache bench crash-trials`)."""
    parser = argparse.ArgumentParser(prog="crash_trials", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    from hybridcache.tools.make_tiny_model import ensure_checkpoint

    checkpoint = args.checkpoint or ensure_checkpoint(args.workdir / args.preset, args.preset, seed=0)
    settings = TrialSettings(checkpoint=checkpoint, workdir=args.workdir, trials=args.trials,
                             conversations=args.conversations, turns=args.turns,
                             words_per_turn=args.words_per_turn, seed=args.seed,
                             modes=tuple(args.modes.split(",")))
    results = asyncio.run(run_trials(settings))
    passed = sum(r.passed for r in results)
    modes = {mode: sum(1 for r in results if r.mode == mode) for mode in MODES}
    mid_compaction = sum(r.mid_compaction for r in results)
    print(f"{passed}/{len(results)} trials passed; modes {modes}; killed mid-compaction {mid_compaction}; "
          f"durable conversations checked {sum(r.durable for r in results)}")
    if args.json is not None:
        args.json.write_text(json.dumps([r.__dict__ | {"passed": r.passed} for r in results], indent=1))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
