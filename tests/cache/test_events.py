"""Events: msgpack round trip, and bad events are rejected with the index left unchanged."""

import msgspec
import pytest
from cache_factories import checked_cache, geometry, run_request, tokens

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity


def _populated_cache():
    journal: list = []
    cache = checked_cache(journal=journal)
    run_request(cache, tokens(300), generated=tokens(30, 1), taps=[128])
    return cache, journal


def test_every_journaled_event_survives_an_encode_decode_round_trip():
    _, journal = _populated_cache()
    assert {type(e) for e in journal} >= {ev.LaneStaged, ev.BlockInserted, ev.SnapshotPublished}
    for event in journal:
        assert ev.decode_event(ev.encode_event(event)) == event


def test_a_checkpoint_proves_the_digest_and_a_wrong_one_is_rejected():
    cache, _ = _populated_cache()
    state_before = cache.index.digest()
    checkpoint = cache.checkpoint()
    assert checkpoint.digest == state_before
    _assert_rejected(cache.index, ev.Checkpoint(cache.index.seq + 1, checkpoint.digest ^ 1), "digest differs")


def _assert_rejected(index: PrefixIndex, event, fragment: str) -> None:
    before = index.digest()
    with pytest.raises(EventRejected, match=fragment):
        index.apply(event)
    assert index.digest() == before, "a rejected event changed the index"
    check_integrity(index)


def test_out_of_sequence_events_are_rejected_and_change_nothing():
    cache, _ = _populated_cache()
    index = cache.index
    _assert_rejected(index, ev.GdsfInflated(index.seq + 2, 1.0), "seq")
    _assert_rejected(index, ev.GdsfInflated(index.seq, 1.0), "seq")


@pytest.mark.parametrize(
    "make_event, fragment",
    [
        (lambda i: ev.BlockInserted(0, 42, 100, 1, (1,) * 64), "lane 42 is not staged"),
        (lambda i: ev.SnapshotDeleted(0, 999), "snapshot 999 does not exist"),
        (lambda i: ev.GdsfInflated(0, -1.0), "L would fall"),
        (
            lambda i: ev.LaneStaged(0, 5, True, 2, 64, path_end=None, private_pages=()),
            "needs 1 path blocks",
        ),
        (lambda i: ev.LanePagesGranted(0, 0, (0,)), "lane 0 is not staged"),
        (lambda i: ev.DeviceCopiesDropped(0, (1, 1)), "named twice"),
        (lambda i: ev.DeviceCopiesDropped(0, (), (0,)), "snapshot 0 is not a host-backed LRU entry|0 is not"),
        (lambda i: ev.NodeHostDropped(0, 1), "not dead KV"),
        (lambda i: ev.SubtreeDeleted(0, 0), "root is never deleted"),
        (lambda i: ev.RestoreLanded(0, 77), "no restore batch 77"),
        (lambda i: ev.SnapshotRetained(0, 0), "not superseded"),
        (lambda i: ev.HostWriteOpened(0, 50, (1,), (0,)), "not free|not device-only"),
    ],
)
def test_inconsistent_events_are_rejected_and_change_nothing(make_event, fragment):
    cache, _ = _populated_cache()
    index = cache.index
    event = msgspec.structs.replace(make_event(index), seq=index.seq + 1)
    _assert_rejected(index, event, fragment)


def test_a_page_already_owned_cannot_be_granted_again():
    cache = checked_cache(geometry(num_pages=8))
    index = cache.index
    index.apply(ev.LaneStaged(1, 0, True, 0, 0, None, (0, 1)))
    _assert_rejected(index, ev.LanePagesGranted(2, 0, (1, 2)), "page 1 is not free")
    _assert_rejected(index, ev.LaneStaged(2, 1, True, 0, 0, None, (5,)), "slot 0 is not free")
