"""The journal part of `hybridcache bench persistence`: what `--event-log` costs the engine's decode.

Two measurements. The direct one: decode tok/s with the event log over without, as the median of
alternating on/off pairs of fresh engines on the micro checkpoint (with the lowest and highest pair, and
the same ratio in tokens per CPU second). On a shared 2-core machine single pairs swing by tens of per
cent either way (identical engines differ too), so the median is what to read, and many short pairs
(25 x 120 tokens) hold it steadier than a few long ones: 0.99-1.02 over four runs here, where 9 x 300
tokens swung 0.91-1.05. The explanatory one: the events the measured engines
journaled per decode token, the process CPU one event costs to journal (queueing on the worker plus
encoding, CRC and the write on the writer thread), and the overhead those two explain at the measured
decode rate (`cpu_share`; the overhead it explains is 1 - cpu_share).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import NamedTuple

JOURNAL_PAIRS = 25
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
    """Decode tok/s with an event log over without on the micro checkpoint, as the median of `pairs`
    pair ratios. Each pair starts two fresh engines (one with `--event-log`; which one is built first
    alternates), gives each an uncounted warm-up request, then times one request on each, back to back,
    in alternating order (on/off, off/on, ...), so drift, other load and engine-to-engine variation
    (identical engines differ by up to ~10 % here) spread over both sides."""
    from hybridcache.tools.make_tiny_model import ensure_checkpoint

    model = ensure_checkpoint(folder / "micro", "micro")
    ratios, cpu_ratios, plain_rates = [], [], []
    for pair in range(pairs):
        order = (True, False) if pair % 2 == 0 else (False, True)
        engines = {
            with_log: _engine(model, folder / f"events-{pair}.log" if with_log else None)
            for with_log in order
        }
        for engine in engines.values():
            await engine.start()
        try:
            for engine in engines.values():
                await _decode_rate(model, engine, WARM_UP_TOKENS)
            rates = {with_log: await _decode_rate(model, engines[with_log], tokens) for with_log in order}
        finally:
            for engine in engines.values():
                await engine.stop()
        ratios.append(rates[True].per_second / rates[False].per_second)
        cpu_ratios.append(rates[True].per_cpu_second / rates[False].per_cpu_second)
        plain_rates.append(rates[False].per_second)
    events = _journaled_events(folder, pairs)
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


def _journaled_events(folder: Path, pairs: int) -> list:
    """Every event the measured engines journaled (their logs' payloads, decoded)."""
    from hybridcache.cache.events import decode_event
    from hybridcache.persistence.journal import JournalReader, journal_segments

    events = []
    for pair in range(pairs):
        for segment in journal_segments(folder / f"events-{pair}.log"):
            events.extend(decode_event(bytes(payload)) for payload in JournalReader(segment).payloads())
    return events


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

    frontend = Frontend.from_dir(model, engine.max_model_len)
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
