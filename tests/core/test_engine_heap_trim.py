"""The worker gives freed heap back to the OS once per busy-to-idle transition, starting with the first idle
moment after start (loading freed a tokenizer's JSON and the weights' transient copies)."""

from __future__ import annotations

import asyncio

import pytest

from hybridcache.core import worker as worker_module
from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import generate, start_engine, token_prompt


async def _settle(calls: list[int], expected: int) -> None:
    for _ in range(200):
        if len(calls) >= expected:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # an idle worker must not trim again meanwhile


@pytest.mark.asyncio
async def test_trims_once_after_start_and_once_after_each_busy_spell(micro_checkpoint, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(worker_module, "heap_trimmer", lambda: lambda: calls.append(1))
    engine = await start_engine(micro_checkpoint, endpoint_refill=False)  # one busy spell per request
    try:
        await _settle(calls, 1)
        assert len(calls) == 1
        frontend = Frontend.from_dir(micro_checkpoint, 32768, engine.tokenizer)
        assert frontend.tokenizer is engine.tokenizer  # loaded once
        await generate(engine, token_prompt(frontend, list(range(10, 90))), max_tokens=4)
        await _settle(calls, 2)
        assert len(calls) == 2
    finally:
        await engine.stop()
