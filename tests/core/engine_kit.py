"""Factories and helpers for engine tests: a started engine on the micro checkpoint, one-call generation."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from hybridcache.cache.records import SnapshotKind
from hybridcache.config import CacheOptions, EngineOptions, resolve_options
from hybridcache.core.api import PreparedPrompt, RequestAccounting
from hybridcache.core.engine import Engine
from hybridcache.core.frontend import Frontend
from hybridcache.core.sampling_params import SamplingParams


async def start_engine(
    model_dir: Path,
    *,
    chunk: int | None = 256,
    lanes: int = 2,
    pages: int = 512,
    dtype: str = "auto",
    device: str = "auto",
    **cache,
) -> Engine:
    options = resolve_options(
        EngineOptions(
            model=str(model_dir),
            dtype=dtype,
            device=device,
            prefill_chunk=chunk,
            max_concurrency=lanes,
            kv_capacity=pages,
            cache=CacheOptions(**cache),
        )
    )
    engine = Engine(model_dir, options, debug_integrity=True)
    await engine.start()
    return engine


class Generated(NamedTuple):
    tokens: list[int]
    accounting: RequestAccounting
    first_logprobs: dict[int, float]
    finish_reason: str | None


async def generate(engine: Engine, prompt: PreparedPrompt, max_tokens: int = 16, **sampling) -> Generated:
    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, logprobs=True, top_logprobs=20, ignore_eos=True, **sampling
    )
    tokens: list[int] = []
    accounting = None
    first: dict[int, float] = {}
    reason = None
    async for output in engine.submit(prompt, params):
        if output.logprobs and not first:
            first = dict(output.logprobs[0].top)
        tokens.extend(output.token_ids)
        accounting = output.accounting or accounting
        reason = output.finish_reason or reason
    assert accounting is not None
    return Generated(tokens, accounting, first, reason)


def token_prompt(frontend: Frontend, tokens: list[int], **kwargs) -> PreparedPrompt:
    return frontend.prepare_tokens(tokens, **kwargs)


def filler_tokens(count: int, seed: int) -> list[int]:
    """Deterministic byte tokens (the micro vocabulary's first 256 ids are bytes)."""
    state = seed * 2654435761 % 2**32 or 1
    out = []
    for _ in range(count):
        state = (state * 1103515245 + 12345) % 2**31
        out.append(32 + state % 90)
    return out


def snapshot_frontiers(engine: Engine, kind: SnapshotKind | None = None) -> list[int]:
    return sorted(s.frontier for s in engine.cache.index.snapshots.values() if kind is None or s.kind == kind)


async def cold_run(
    model_dir: Path, frontend: Frontend, tokens: list[int], dtype: str, max_tokens: int
) -> Generated:
    """`tokens` greedily continued by a fresh engine with prefix reuse off: what a resumed run must equal."""
    engine = await start_engine(model_dir, dtype=dtype, prefix_reuse=False)
    try:
        return await generate(engine, frontend.prepare_tokens(tokens), max_tokens)
    finally:
        await engine.stop()
