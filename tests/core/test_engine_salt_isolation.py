"""Tenant isolation below the first block: a snapshot anchored at the root (frontier < 64) carries no
block whose extra key holds the cache salt, so salted prompts neither create nor match one."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridcache.cache.tap_planner import Placement, PlannedTap, TapSource
from hybridcache.core import worker as worker_module
from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import filler_tokens, generate, start_engine

ROOT_TAP = 40  # below the first 64-token block, where a structural tap (end of a short system prompt) lands
PROMPT_LENGTHS = (10, 30, 41, 50, 63, 64, 65, 100, 129, 150, 200)


@pytest.fixture
def root_taps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every prompt longer than ROOT_TAP also plans an exact boundary tap at ROOT_TAP (no planner rule
    lands one there today; structural taps will)."""
    real_plan = worker_module.plan_taps

    def with_root_tap(n, base, *args, **kwargs):
        planned = real_plan(n, base, *args, **kwargs)
        if base < ROOT_TAP < n - 1:
            planned = sorted([*planned, PlannedTap(ROOT_TAP, Placement.EXACT, TapSource.STRUCTURAL, True)])
        return planned

    monkeypatch.setattr(worker_module, "plan_taps", with_root_tap)


async def test_identical_prompts_under_two_salts_never_hit_each_other(
    micro_checkpoint: Path, root_taps
):
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    # A snapshot inside a block is inexact (cache/exactness.py): only an inexact resume uses the root taps.
    engine = await start_engine(
        micro_checkpoint, pages=256, lanes=1, host_cache_mib=64, exact_resume=False, endpoint_refill=False
    )
    unsalted_root_hits = 0
    for n in PROMPT_LENGTHS:
        tokens = filler_tokens(n, seed=n)
        first = await generate(engine, frontend.prepare_tokens(tokens, cache_salt="tenant-a"), 4)
        other = await generate(engine, frontend.prepare_tokens(tokens, cache_salt="tenant-b"), 4)
        plain = await generate(engine, frontend.prepare_tokens(tokens), 4)
        assert first.accounting.reuse_tokens == 0, n
        assert other.accounting.reuse_tokens == 0, (n, "tenant-b reused tenant-a's prefix")
        assert plain.accounting.reuse_tokens == 0, (n, "an unsalted prompt reused a salted prefix")
        assert other.tokens == first.tokens == plain.tokens
        again = await generate(engine, frontend.prepare_tokens(tokens), 4)  # the unsalted root tap serves
        unsalted_root_hits += 0 < again.accounting.reuse_tokens < 64
        for salt in ("tenant-a", "tenant-b"):
            repeat = await generate(engine, frontend.prepare_tokens(tokens, cache_salt=salt), 4)
            assert repeat.accounting.reuse_tokens == 0 or repeat.accounting.reuse_tokens >= 64, (n, salt)
            assert repeat.tokens == first.tokens
        engine.check_integrity()
    assert unsalted_root_hits > 0  # the injected root taps exist and would be shared without the rule
    root = engine.cache.index.root
    assert root.snapshots, "no root-anchored snapshot was published"
    await engine.stop()
