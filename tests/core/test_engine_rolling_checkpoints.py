"""The worker checkpoints a large index one slice per unit, and the event log still replays exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridcache.cache import checkpoint_round
from hybridcache.cache.events import Checkpoint, decode_event
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.index import PrefixIndex
from hybridcache.core import worker as worker_module
from hybridcache.core.frontend import Frontend
from hybridcache.persistence.journal import JournalReader, journal_segments
from tests.core.engine_kit import filler_tokens, generate, start_engine


async def test_sliced_checkpoints_between_units_replay_to_the_live_state(
    micro_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(worker_module, "CHECKPOINT_EVERY_EVENTS", 20)  # a round starts every 20 events
    monkeypatch.setattr(checkpoint_round, "RECORDS_PER_PART", 4)  # so even this index takes many slices
    log_path = tmp_path / "events.log"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(
        micro_checkpoint, pages=64, lanes=1, host_cache_mib=64, event_log=str(log_path)
    )
    shared = filler_tokens(300, seed=3)
    for turn in range(5):
        await generate(engine, frontend.prepare_tokens(shared + filler_tokens(200, seed=20 + turn)), 24)
    await engine.stop()

    events = [decode_event(bytes(p)) for s in journal_segments(log_path) for p in JournalReader(s).payloads()]
    sliced = [e for e in events if isinstance(e, Checkpoint) and e.parts > 1]
    assert len(sliced) >= 4
    first_round = [e.part for e in sliced if e.parts == sliced[0].parts][: sliced[0].parts]
    assert first_round == list(range(sliced[0].parts))  # a round hands out its parts in order
    header = JournalReader(journal_segments(log_path)[0]).header
    index = PrefixIndex(CacheGeometry(**header.options["geometry"]))
    for event in events:
        index.apply(event)  # every Checkpoint slice is checked against the fold at its seq
    assert index.digest() == engine.cache.index.digest()
