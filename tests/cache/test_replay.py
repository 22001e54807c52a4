"""Replay determinism (issue 3): random engine-level operation sequences through the Cache facade.

Every produced event is journaled; the journal, encoded and decoded, folded into a fresh index
reproduces the identical digest, and check_integrity holds after every event (live and replayed).
"""

import random

import pytest
from cache_factories import checked_cache, geometry, prompt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridcache.cache import events as ev
from hybridcache.cache.facade import Cache
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.match import Readiness
from hybridcache.cache.write_back import HostWrite

CONCURRENCY = 3
OPERATIONS = (
    "start",
    "start",
    "advance",
    "advance",
    "advance",
    "tap",
    "publish",
    "finish",
    "cancel",
    "release",
    "land",
    "land",
    "checkpoint",
)
WITH_FLUSH = (*OPERATIONS, "flush")  # the stop-time flush, at any moment


class Lane:
    def __init__(self, tokens: list[int], reuse: int) -> None:
        self.tokens = tokens
        self.progress = reuse
        self.prompt_length = len(tokens)


class EngineDriver:
    """Plays the engine: starts requests, prefills, decodes, taps, finishes, lands copies."""

    def __init__(
        self, seed: int, host_slabs: int, host_write: HostWrite = HostWrite.BACK, num_pages: int = 48
    ) -> None:
        self.rng = random.Random(seed)
        self.journal: list = []
        self.geometry = geometry(
            num_pages=num_pages, host_slabs=host_slabs, concurrency=CONCURRENCY, snapshot_slots=3
        )
        self.cache: Cache = checked_cache(self.geometry, self.journal, host_write=host_write)
        self.lanes: dict[int, Lane] = {}
        self.batches: list[tuple[str, int]] = []
        self.history: list[list[int]] = [self._fresh(200)]
        self.preambles = [self._fresh(130), self._fresh(70)]

    def _fresh(self, count: int) -> list[int]:
        return [self.rng.randrange(1, 1000) for _ in range(count)]

    def step(self, operation: str) -> None:
        getattr(self, f"_op_{operation}")()

    def _pick_lane(self) -> int | None:
        return self.rng.choice(sorted(self.lanes)) if self.lanes else None

    def _op_start(self) -> None:
        free = [lane for lane in range(CONCURRENCY) if lane not in self.lanes]
        if not free:
            return
        base = self.rng.choice(self.history + self.preambles)
        keep = len(base) if self.rng.random() < 0.5 else self.rng.randrange(1, len(base) + 1)
        toks = base[:keep] + self._fresh(self.rng.randrange(1, 150))
        quoted = self.cache.quote(prompt(toks, 64, enabled=self.rng.random() > 0.1))
        if quoted.readiness != Readiness.READY:
            return
        lane = free[0]
        staged = self.cache.stage(quoted, lane)
        self.cache.activate(lane)
        if staged.restore is not None:
            self.batches.append(("restore", staged.restore.batch))
        self.lanes[lane] = Lane(toks, staged.reuse_tokens)

    def _op_advance(self) -> None:
        lane_id = self._pick_lane()
        if lane_id is None:
            return
        lane = self.lanes[lane_id]
        lane.progress += self.rng.randrange(1, 160)
        if lane.progress > len(lane.tokens):
            lane.tokens += self._fresh(lane.progress - len(lane.tokens))
        needed = -(-lane.progress // BLOCK_TOKENS) - len(self.cache.block_table(lane_id))
        if needed > 0 and self.cache.allocate_growth_pages(lane_id, needed) is None:
            # Cannot grow: bounded completion stops at the last page the lane holds, then finishes.
            lane.progress = min(lane.progress, BLOCK_TOKENS * len(self.cache.block_table(lane_id)))
            self._finish(lane_id, "finish")
            return
        self.cache.commit_blocks(lane_id, lane.tokens[: lane.progress])

    def _op_tap(self) -> None:
        lane_id = self._pick_lane()
        if lane_id is None:
            return
        lane = self.lanes[lane_id]
        if 0 < lane.progress <= lane.prompt_length - 1:
            self.cache.take_tap(lane_id, lane.progress, boundary=self.rng.random() < 0.3)

    def _op_publish(self) -> None:
        lane_id = self._pick_lane()
        if lane_id is not None:
            result = self.cache.publish_ready_taps(
                lane_id, self.lanes[lane_id].tokens[: self.lanes[lane_id].progress]
            )
            if result.write is not None:
                self.batches.append(("write", result.write.batch))

    def _finish(self, lane_id: int, how: str) -> None:
        lane = self.lanes.pop(lane_id)
        committed = lane.tokens[: lane.progress]
        if how == "finish":
            result = self.cache.finish(lane_id, committed)
        elif how == "cancel":
            result = self.cache.cancel(lane_id, committed)
        else:
            result = self.cache.release(lane_id)
        for write in (result.taps.write, result.write):
            if write is not None:
                self.batches.append(("write", write.batch))
        if len(committed) > 0:
            self.history.append(committed)

    def _op_finish(self) -> None:
        self._finish_any("finish")

    def _op_cancel(self) -> None:
        self._finish_any("cancel")

    def _op_release(self) -> None:
        self._finish_any("release")

    def _finish_any(self, how: str) -> None:
        lane_id = self._pick_lane()
        if lane_id is not None:
            self._finish(lane_id, how)

    def _op_land(self) -> None:
        if not self.batches:
            return
        kind, batch = self.batches.pop(self.rng.randrange(len(self.batches)))
        if kind == "restore":
            self.cache.restore_done(batch)
        else:
            self.cache.host_write_done(batch)

    def _op_checkpoint(self) -> None:
        self.cache.checkpoint()

    def _op_flush(self) -> None:  # the stop before a save, at any moment
        write = self.cache.flush_to_host()
        if write is not None:
            self.batches.append(("write", write.batch))

    def drain(self) -> None:
        for lane_id in sorted(self.lanes):
            self._finish(lane_id, "finish")
        while self.batches:
            self._op_land()


def replay(journal: list, geometry_used) -> PrefixIndex:
    """Fold the encoded journal into a fresh index, checking integrity after every event."""
    fresh = PrefixIndex(geometry_used)
    for data in [ev.encode_event(event) for event in journal]:
        fresh.apply(ev.decode_event(data))
        check_integrity(fresh)
    return fresh


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    operations=st.lists(st.sampled_from(WITH_FLUSH), min_size=10, max_size=70),
    host_slabs=st.sampled_from([0, 12, 40, 200]),
    host_write=st.sampled_from(list(HostWrite)),
)
def test_replaying_the_journal_reproduces_the_live_digest(seed, operations, host_slabs, host_write):
    driver = EngineDriver(seed, host_slabs, host_write)
    for operation in operations:
        driver.step(operation)
    driver.drain()
    driver.cache.checkpoint()
    replayed = replay(driver.journal, driver.geometry)
    assert replayed.digest() == driver.cache.index.digest()
    assert replayed.seq == len(driver.journal)


@pytest.mark.parametrize("num_pages", [48, 32])
def test_a_long_mixed_session_replays_exactly_and_ends_with_no_pins(num_pages: int):
    driver = EngineDriver(seed=7, host_slabs=40, num_pages=num_pages)
    for _ in range(400):
        driver.step(driver.rng.choice(OPERATIONS))
    driver.drain()
    if num_pages == 32:  # a device small enough that eviction writes reachable blocks back
        assert driver.cache.stats.written_back_blocks > 0
    index = driver.cache.index
    assert not index.lanes and not index.restores and not index.host_writes
    assert all(n.active_refs == 0 and n.restore_pins == 0 for n in index.nodes.values())
    assert replay(driver.journal, driver.geometry).digest() == index.digest()
