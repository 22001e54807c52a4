"""Cold prompts arriving together on few lanes and snapshot slots: every prompt keeps its taps.

A cold prompt is hedged where hedges have a host budget (tap_planner's HEDGE), so one prompt's pass can
take every device snapshot slot, and a published snapshot keeps its slot until its host copy lands. The
next lane's pass starts right after: unless it waits for those copies (``Worker._taps_await_image_writes``)
it finds no slot and keeps no snapshot. Four ~260-token chat prompts sent at once to two lanes (D = 3
slots, a 32 MiB host tier), then two follow-ups each: every follow-up resumes the end of its system prompt.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

from hybridcache.cache.tap_planner import HintKind
from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import generate, start_engine

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda",
         "sigma", "tau", "omega"]


@pytest.fixture(scope="module")
def frontend(tiny_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(tiny_checkpoint, 32768)


def chat(seed: int, turn: int) -> list[dict]:
    rng = random.Random(seed)
    system = " ".join(rng.choice(WORDS) for _ in range(230))
    return [{"role": "system", "content": system}, {"role": "user", "content": f"question number {turn}"}]


async def test_cold_prompts_together_leave_every_follow_up_its_system_prompt(
    tiny_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(tiny_checkpoint, chunk=2048, lanes=2, pages=256, host_cache_mib=32)
    try:
        seeds = [101, 102, 103, 104]
        first = await asyncio.gather(*(generate(engine, frontend.prepare_chat(chat(s, 0)), 1) for s in seeds))
        assert all(r.accounting.reuse_tokens == 0 for r in first)
        for seed in seeds:
            hints = frontend.prepare_chat(chat(seed, 0)).tap_hints
            system_end = min(p for p, kind in hints if kind == HintKind.STRUCTURAL)
            for turn in (1, 2):
                result = await generate(engine, frontend.prepare_chat(chat(seed, turn)), 1)
                assert result.accounting.reuse_tokens >= system_end, (seed, turn, result.accounting)
    finally:
        await engine.stop()
