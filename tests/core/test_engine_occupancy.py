"""/v1/cache/stats' occupancy figures: what a running request holds shows up, and all of it is given back
when the engine is idle again (what the soak bench checks for leaks)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hybridcache.core.frontend import Frontend
from hybridcache.core.sampling_params import SamplingParams
from tests.core.engine_kit import filler_tokens, generate, start_engine, token_prompt

HELD = ("pinned_blocks", "cache_lanes", "lane_private_pages")


async def _idle_stats(engine, timeout_s: float = 10.0) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        stats = engine.stats()
        # an idle-time endpoint refill holds a lane (and pins its path) while it runs, without counting as
        # a running request: idle means it is done too
        busy = ("requests_running", "host_writes_in_flight", "endpoint_refills_running",
                "endpoint_refills_pending")
        settled = not any(stats[key] for key in busy)
        if settled or asyncio.get_running_loop().time() > deadline:
            return stats
        await asyncio.sleep(0.02)


async def test_a_running_request_holds_lanes_and_pins_and_gives_them_all_back(micro_checkpoint: Path):
    frontend = Frontend.from_dir(micro_checkpoint, 4096)
    engine = await start_engine(micro_checkpoint, lanes=2, host_cache_mib=16, host_write="through")
    try:
        prompt = token_prompt(frontend, filler_tokens(300, seed=1))
        await generate(engine, prompt, max_tokens=4)  # cached blocks to resume from
        stream = engine.submit(prompt, SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True))
        seen: dict = {}
        async for _ in stream:
            seen = engine.stats()
            if seen["cache_lanes"]:
                break
        assert seen["cache_lanes"] == 1 and seen["worker_lanes_free"] == 1
        assert seen["pinned_blocks"] >= 4  # the resumed path is pinned while the lane runs
        await stream.aclose()  # cancels the request
        stats = await _idle_stats(engine)
        assert {key: stats[key] for key in HELD} == dict.fromkeys(HELD, 0)
        assert stats["pinned_snapshots"] == 0 and stats["restores_in_flight"] == 0
        assert stats["worker_lanes_free"] == 2
        assert stats["slots_active"] == 0 and stats["slots_staging"] == 0
        assert stats["host_slabs_used"] > 0  # the cache itself stays (not a leak)
        assert stats["worker_stall_max_seconds"] >= 0.0
        engine.check_integrity()
    finally:
        await engine.stop()
