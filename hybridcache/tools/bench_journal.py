"""The journal part of `hybridcache bench persistence`: what `--event-log` costs the engine's decode.

Two measurements. The direct one: decode tok/s with the event log over without, as the median of
alternating on/off pairs of requests on one engine of the micro checkpoint started with `--event-log`,
whose cache facade journals through the log for the "on" request of a pair and through nothing for the
"off" one (with the lowest and highest pair, and the same ratio in tokens per CPU second). On a shared
2-core machine single requests swing by tens of per cent either way, so the median is what to read.
The previous design (a pair of fresh engines per pair, one with the log) added engine-to-engine
variation of up to ~10 %: its median of 25 pairs read 0.92-1.05 over seven runs on one day (two of them
on the previous commit). This one still swings with the machine: six runs of 60 pairs read 0.95-1.04
(mean 1.00) on one day, while the journal's own CPU explained 0.005 % of decode time; a single run
resolves about +-4 %. The explanatory one: the events the measured engine journaled per decode token,
the process CPU one event costs to journal (queueing on the worker plus encoding, CRC and the write on
the writer thread), and the overhead those two explain at the measured decode rate (`cpu_share`; the
overhead it explains is 1 - cpu_share).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import NamedTuple

JOURNAL_PAIRS = 60
WARM_UP_TOKENS = 32
COST_EVENTS = 20000


class JournalOverhead(NamedTuple):
    """Decode tok/s with the event log over without: the median of alternating pairs, and the spread."""

    median: float
    lowest: float
    highest: float
    cpu_median: float  # the same with tokens per CPU second: steadier on a shared machine
    pairs: int
    events_per_token: float  # journaled events per timed decode token (an upper bound: warm-ups count)
    cpu_us_per_event: float  # CPU of queueing, encoding, framing and writing one event, both threads
    cpu_share: float  # events/token x CPU/event x tok/s: the share of decode time the journal's work costs


async def measure_journal(folder: Path, tokens: int, pairs: int = JOURNAL_PAIRS) -> JournalOverhead:
    """Decode tok/s with the event log over without on the micro checkpoint, as the median of `pairs`
    pair ratios. One engine starts with `--event-log` and answers an uncounted warm-up request; each pair
    then times one request journaled through the log and one journaled nowhere (the facade's journal
    detached), back to back, in alternating order (on/off, off/on, ...), so drift and other load spread
    over both sides."""
    from hybridcache.tools.make_tiny_model import ensure_checkpoint

    model = ensure_checkpoint(folder / "micro", "micro")
    engine = _engine(model, folder / "events.log")
    await engine.start()
    sink = engine.cache.journal
    ratios, cpu_ratios, plain_rates = [], [], []
    try:
        await _decode_rate(model, engine, WARM_UP_TOKENS)
        for pair in range(pairs):
            rates = {}
            for with_log in (True, False) if pair % 2 == 0 else (False, True):
                engine.cache.journal = sink if with_log else None
                rates[with_log] = await _decode_rate(model, engine, tokens)
            ratios.append(rates[True].per_second / rates[False].per_second)
            cpu_ratios.append(rates[True].per_cpu_second / rates[False].per_cpu_second)
            plain_rates.append(rates[False].per_second)
    finally:
        engine.cache.journal = sink
        await engine.stop()
    events = _journaled_events(folder / "events.log")
    events_per_token = len(events) / (pairs * tokens)
    cpu_us = _journal_cpu_us_per_event(folder / "cost.log", events)
    share = events_per_token * cpu_us * 1e-6 * statistics.median(plain_rates)
    return JournalOverhead(
        statistics.median(ratios),
        min(ratios),
        max(ratios),
        statistics.median(cpu_ratios),
        pairs,
        events_per_token,
        cpu_us,
        share,
    )


def _journaled_events(log: Path) -> list:
    """Every event the measured engine journaled (its log's payloads, decoded)."""
    from hybridcache.cache.events import decode_event
    from hybridcache.persistence.journal import JournalReader, journal_segments

    return [
        decode_event(bytes(payload))
        for segment in journal_segments(log)
        for payload in JournalReader(segment).payloads()
    ]


def _journal_cpu_us_per_event(path: Path, events: list) -> float:
    """Process CPU microseconds per event to journal ``events`` (repeated to at least COST_EVENTS) through
    the engine's sink: the worker's queueing plus the writer thread's encoding, CRC and write."""
    from hybridcache.cache.geometry import CacheGeometry
    from hybridcache.persistence.event_sink import open_journal

    if not events:
        return 0.0
    repeated = events * max(1, -(-COST_EVENTS // len(events)))
    geometry = CacheGeometry(
        num_pages=1,
        page_bytes=4096,
        image_bytes=4096,
        slab_bytes=4096,
        host_cache_bytes=4096,
        max_concurrency=1,
        device_snapshot_slots=1,
    )
    sink = open_journal(str(path), "bench", geometry, {})
    started = time.process_time()
    for event in repeated:
        sink.append(event)
    sink.writer.flush()
    cpu = time.process_time() - started
    sink.writer.close()
    return cpu / len(repeated) * 1e6


def _engine(model: Path, event_log: Path | None):
    from hybridcache.config import CacheOptions, EngineOptions, resolve_options
    from hybridcache.core.engine import Engine

    cache = CacheOptions(host_cache_mib=64, event_log=None if event_log is None else str(event_log))
    return Engine(model, resolve_options(EngineOptions(model=str(model), kv_capacity=256, cache=cache)))


class DecodeRate(NamedTuple):
    per_second: float  # tokens per wall-clock second
    per_cpu_second: float  # tokens per CPU second of this process (every thread, the journal's too)


async def _decode_rate(model: Path, engine, tokens: int) -> DecodeRate:
    """Greedy decode rate of one request, from its first output to its last."""
    from hybridcache.core.frontend import Frontend
    from hybridcache.core.sampling_params import SamplingParams

    frontend = Frontend.from_dir(model, engine.max_model_len, engine.tokenizer)
    prompt = frontend.prepare_text("journal overhead " * 20)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    first: tuple[float, float] | None = None
    decoded = 0
    async for output in engine.submit(prompt, params):
        if first is None:
            first = (time.perf_counter(), time.process_time())
        else:
            decoded += len(output.token_ids)
    assert first is not None and decoded > 0, "the request produced no decode tokens"
    return DecodeRate(decoded / (time.perf_counter() - first[0]), decoded / (time.process_time() - first[1]))
