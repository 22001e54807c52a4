"""The Host tier's memory comes in chunks allocated on first use; a chunk the allocator refuses in the
middle of a run (pinned memory exhausted, an allocator limit) must not take the server down: an anonymous
mapping holds it instead, requests keep being served with the cold run's tokens, the cache stays
consistent, and the stats say so. (Before, the refusal failed the engine and every request after it.)"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import pytest

from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.slab_pool import HostSlabPool
from hybridcache.core import runtime
from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import filler_tokens, generate, start_engine

SMALL_CHUNK = 1 << 20  # instead of 4 GiB: the 8 MiB tier below is 8 chunks, only the first allocated at start


@pytest.fixture
def later_chunks_refused(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Chunks of SMALL_CHUNK bytes; the allocator gives the first (at start-up) and refuses every later
    one as torch does when memory runs out. Returns the sizes asked for."""
    asked: list[int] = []
    real = runtime.cpu_allocator

    def allocate(nbytes: int):
        asked.append(nbytes)
        if len(asked) > 1:
            raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: tried {nbytes} bytes")
        return real(nbytes)

    monkeypatch.setattr(runtime, "cpu_allocator", allocate)
    monkeypatch.setattr(runtime, "HostSlabPool", functools.partial(HostSlabPool, chunk_bytes=SMALL_CHUNK))
    monkeypatch.setattr(runtime, "CacheGeometry", functools.partial(CacheGeometry, chunk_bytes=SMALL_CHUNK))
    return asked


@pytest.mark.parametrize("host_write", ["through", "back"])
async def test_a_host_chunk_refused_mid_run_keeps_the_server_serving(
    micro_checkpoint: Path, later_chunks_refused: list[int], host_write: str, caplog: pytest.LogCaptureFixture
):
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(micro_checkpoint, pages=24, lanes=1, host_cache_mib=8, host_write=host_write)
    try:
        prompts = [frontend.prepare_tokens(filler_tokens(700, seed=300 + n)) for n in range(8)]
        with caplog.at_level(logging.WARNING, logger="hybridcache"):
            cold = [await generate(engine, prompt, 6) for prompt in prompts]  # past chunk 0 into chunk 1..
        assert len(later_chunks_refused) > 1, "the run never reached a second chunk"
        assert any("using an anonymous mapping instead" in r.getMessage() for r in caplog.records)
        engine.check_integrity()
        again = [await generate(engine, prompt, 6) for prompt in prompts]
        assert [g.tokens for g in again] == [g.tokens for g in cold]
        assert sum(g.accounting.reuse_tokens for g in again) > 0
        engine.check_integrity()
        stats = engine.stats()
        assert not stats["stopping"]
        assert stats["host_tier_fallback_chunks"] == len(later_chunks_refused) - 1
        assert stats["host_slabs_used"] > SMALL_CHUNK // engine.runtime.geometry.slab_bytes  # past chunk 0
    finally:
        await engine.stop()
