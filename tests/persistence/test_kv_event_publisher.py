"""The KV-event publisher as a router sees it over ZMQ: the full state first, then changes that keep a
router's view equal to the replica's resumable cover; replays answer with the state; a publisher that
falls behind clears the router once and counts what it dropped."""

from __future__ import annotations

import socket
import time

import pytest
from cache_factories import checked_cache, geometry, run_request, tokens

from hybridcache.cache.resumable_cover import ResumableCover, Tier
from hybridcache.persistence.kv_event_publisher import KvEventPublisher, KvEventsUnavailable
from hybridcache.persistence.kv_event_wire import (
    MEDIUM,
    REPLAY_END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    decode_batch,
    seq_frame,
    wire_events,
)

zmq = pytest.importorskip("zmq", reason="pyzmq is a test extra (pip install -e '.[test]')")

TIER_OF = {medium: tier for tier, medium in MEDIUM.items()}


def free_endpoint() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


class Subscriber:
    """A router's side: a SUB socket that folds every batch into per-tier block sets (checking that a
    stored run hangs under a held block, as vllm-router's index requires)."""

    def __init__(self, context, endpoint: str) -> None:
        self.socket = context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.connect(endpoint)
        self.blocks: dict[Tier, set[int]] = {Tier.DEVICE: set(), Tier.HOST: set()}
        self.seqs: list[int] = []
        self.clears = 0

    def fold(self, frames: list[bytes]) -> None:
        topic, seq, payload = frames
        assert topic == b"" and len(seq) == 8
        self.seqs.append(int.from_bytes(seq, "big", signed=True))
        batch = decode_batch(payload)
        assert batch.data_parallel_rank is None
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.clears += 1
                for held in self.blocks.values():
                    held.clear()
            elif isinstance(event, BlockStored):
                held = self.blocks[TIER_OF[event.medium]]
                assert event.block_size == 64 and len(event.token_ids) == 64 * len(event.block_hashes)
                assert event.parent_block_hash is None or event.parent_block_hash in held
                held.update(event.block_hashes)
            else:
                assert isinstance(event, BlockRemoved)
                self.blocks[TIER_OF[event.medium]].difference_update(event.block_hashes)

    def drain(self, settle_s: float = 0.3) -> None:
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline:
            if self.socket.poll(50):
                self.fold(self.socket.recv_multipart())
                deadline = time.monotonic() + settle_s


def expected_cover(cache) -> dict[Tier, set[int]]:
    cover = ResumableCover()
    blocks: dict[Tier, set[int]] = {Tier.DEVICE: set(), Tier.HOST: set()}
    for change in cover.update(cache.index):
        blocks[change.tier].update(block.lookup_hash for block in change.blocks)
    return blocks


@pytest.fixture
def context():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def test_a_subscriber_sees_the_cover_grow_and_shrink_as_the_cache_changes(context):
    geo = geometry(num_pages=24, host_slabs=40, snapshot_slots=3)
    endpoint = free_endpoint()
    publisher = KvEventPublisher(endpoint, geo)
    cache = checked_cache(geo, journal=publisher)
    subscriber = Subscriber(context, endpoint)
    publisher.start()
    try:
        subscriber.drain()
        assert subscriber.clears >= 1  # the state on subscription: cleared, then (empty) cover
        histories = [tokens(150 + 40 * k, seed=k) for k in range(4)]
        for step in range(12):
            k = step % 4
            histories[k] = [*histories[k], *tokens(70, seed=100 + step)]
            run_request(cache, histories[k], lane=step % 2)
            subscriber.drain(0.05)
        subscriber.drain()
        assert subscriber.blocks == expected_cover(cache)
        assert subscriber.blocks[Tier.DEVICE] and subscriber.blocks[Tier.HOST]
        assert subscriber.seqs == list(range(subscriber.seqs[0], subscriber.seqs[-1] + 1))
        assert publisher.stats()["kv_events_batches_dropped"] == 0
        assert publisher.stats()["kv_events_device_blocks"] == len(subscriber.blocks[Tier.DEVICE])
    finally:
        publisher.close()


def test_a_late_subscriber_gets_the_whole_state(context):
    geo = geometry()
    endpoint = free_endpoint()
    publisher = KvEventPublisher(endpoint, geo)
    cache = checked_cache(geo, journal=publisher)
    publisher.start()
    try:
        run_request(cache, tokens(300))
        run_request(cache, tokens(500, seed=1), lane=1)
        time.sleep(0.2)
        late = Subscriber(context, endpoint)
        late.drain()
        assert late.clears == 1
        assert late.blocks == expected_cover(cache) and late.blocks[Tier.DEVICE]
    finally:
        publisher.close()


def test_a_flush_reaches_the_router_as_one_clear_and_leaves_it_empty(context):
    geo = geometry()
    endpoint = free_endpoint()
    publisher = KvEventPublisher(endpoint, geo)
    cache = checked_cache(geo, journal=publisher)
    subscriber = Subscriber(context, endpoint)
    publisher.start()
    try:
        subscriber.drain()
        run_request(cache, tokens(300))
        run_request(cache, tokens(500, seed=1), lane=1)
        subscriber.drain()
        assert subscriber.blocks[Tier.DEVICE]
        clears = subscriber.clears
        assert cache.flush_unpinned() == 2
        publisher.request_resync()
        subscriber.drain()
        assert subscriber.clears == clears + 1
        assert subscriber.blocks == expected_cover(cache) == {Tier.DEVICE: set(), Tier.HOST: set()}
    finally:
        publisher.close()


def replay(context, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """Ask for a replay from ``start`` the way vllm-router does; the (seq, payload) answers before the end
    marker."""
    dealer = context.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    answers = []
    while True:
        assert dealer.poll(2000), "no end marker"
        empty, topic, seq, payload = dealer.recv_multipart()
        assert (empty, topic) == (b"", b"")
        seq_number = int.from_bytes(seq, "big", signed=True)
        if seq_number == REPLAY_END_SEQ:
            dealer.close()
            return answers
        answers.append((seq_number, payload))


def test_a_replay_answers_the_history_from_its_start_then_the_end_marker(context):
    geo = geometry()
    endpoint, replay_endpoint = free_endpoint(), free_endpoint()
    publisher = KvEventPublisher(endpoint, geo, replay_endpoint=replay_endpoint)
    cache = checked_cache(geo, journal=publisher)
    subscriber = Subscriber(context, endpoint)
    publisher.start()
    try:
        run_request(cache, tokens(300))
        run_request(cache, tokens(400, seed=1), lane=1)
        subscriber.drain()
        answers = replay(context, replay_endpoint, 0)
        assert [seq for seq, _ in answers] == list(range(subscriber.seqs[-1] + 1))
        rebuilt = Subscriber(context, free_endpoint())
        for seq, payload in answers:
            rebuilt.fold([b"", seq_frame(seq), payload])
        assert rebuilt.blocks == expected_cover(cache) and rebuilt.blocks[Tier.DEVICE]
        later = replay(context, replay_endpoint, subscriber.seqs[-1])
        assert [seq for seq, _ in later] == [subscriber.seqs[-1]]
        assert replay(context, replay_endpoint, subscriber.seqs[-1] + 1) == []
    finally:
        publisher.close()


def test_a_replay_from_before_the_history_gets_the_full_state_under_the_latest_seq(context):
    geo = geometry()
    endpoint, replay_endpoint = free_endpoint(), free_endpoint()
    publisher = KvEventPublisher(endpoint, geo, replay_endpoint=replay_endpoint, replay_history=1)
    cache = checked_cache(geo, journal=publisher)
    subscriber = Subscriber(context, endpoint)
    publisher.start()
    try:
        run_request(cache, tokens(300))
        subscriber.drain()
        run_request(cache, tokens(400, seed=1), lane=1)
        subscriber.drain()
        assert subscriber.seqs[-1] >= 1  # seq 0 has left the one-batch history
        [(seq, payload)] = replay(context, replay_endpoint, 0)
        assert seq == subscriber.seqs[-1]
        events = decode_batch(payload).events
        assert isinstance(events[0], AllBlocksCleared)
        rebuilt = Subscriber(context, free_endpoint())
        rebuilt.fold([b"", seq_frame(seq), payload])
        assert rebuilt.blocks == expected_cover(cache)
    finally:
        publisher.close()


def test_a_publisher_that_falls_behind_clears_the_router_once_and_counts_the_drops(context):
    geo = geometry()
    endpoint = free_endpoint()
    publisher = KvEventPublisher(endpoint, geo, max_pending_events=10)
    cache = checked_cache(geo, journal=publisher)
    run_request(cache, tokens(300))  # more than ten events before the thread runs
    subscriber = Subscriber(context, endpoint)
    time.sleep(0.1)
    publisher.start()
    try:
        run_request(cache, tokens(300, seed=1), lane=1)
        subscriber.drain()
        stats = publisher.stats()
        assert stats["kv_events_batches_dropped"] == 1
        assert stats["kv_events_events_dropped"] > 10
        assert subscriber.blocks == {Tier.DEVICE: set(), Tier.HOST: set()}
        assert subscriber.clears >= 1
    finally:
        publisher.close()


def test_a_taken_port_is_a_clear_start_error():
    geo = geometry()
    endpoint = free_endpoint()
    first = KvEventPublisher(endpoint, geo)
    try:
        with pytest.raises(KvEventsUnavailable, match="--kv-events: cannot bind"):
            KvEventPublisher(endpoint, geo)
    finally:
        first.close()


def test_salted_blocks_are_published_under_a_name_that_seeds_the_router_hash():
    cache = checked_cache()
    run_request(cache, tokens(300))
    changes = ResumableCover().update(cache.index)
    stored = [event for event in wire_events(changes) if isinstance(event, BlockStored)]
    assert {event.lora_name for event in stored} == {None}
    salted = [change._replace(blocks=tuple(block._replace(extra=7) for block in change.blocks))
              for change in changes]
    names = {event.lora_name for event in wire_events(salted) if isinstance(event, BlockStored)}
    assert names == {"hybridcache-salt-0000000000000007"}
