"""`--event-log`: the engine's journal folds back into exactly the live index."""

from __future__ import annotations

from pathlib import Path

from hybridcache.cache.events import Checkpoint, decode_event
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity
from hybridcache.core.frontend import Frontend
from hybridcache.persistence.journal import JournalReader, journal_segments
from tests.core.engine_kit import filler_tokens, generate, start_engine


async def test_the_event_log_replays_to_the_live_digest(micro_checkpoint: Path, tmp_path: Path):
    log_path = tmp_path / "events.log"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(
        micro_checkpoint, pages=64, lanes=1, host_cache_mib=64, event_log=str(log_path)
    )
    shared = filler_tokens(400, seed=1)
    for turn in range(4):
        await generate(engine, frontend.prepare_tokens(shared + filler_tokens(300, seed=10 + turn)), 20)
    await engine.stop()
    live_digest = engine.cache.index.digest()

    segments = journal_segments(log_path)
    header = JournalReader(segments[0]).header
    index = PrefixIndex(CacheGeometry(**header.options["geometry"]))
    checkpoints = 0
    for segment in segments:
        reader = JournalReader(segment)
        for payload in reader.payloads():
            event = decode_event(bytes(payload))
            if isinstance(event, Checkpoint):
                assert event.digest == index.digest(event.part, event.parts)
                checkpoints += 1
            index.apply(event)
            check_integrity(index)
        assert reader.damage is None
    assert checkpoints >= 1
    assert index.seq == engine.cache.index.seq
    assert index.digest() == live_digest
