"""`--kv-events`: tell a router which prefixes this replica can resume, over ZMQ (an event sink).

The publisher sits beside the journal on the cache's event stream. The worker's share is one list
append under a lock (`append`), plus a one-byte pipe write that wakes the publisher when its inbox was
empty; everything else happens on the publisher's own thread, which sleeps until woken: it folds the
events into a shadow `PrefixIndex` (the same fold `hybridcache replay` runs), diffs the resumable
cover (`cache/resumable_cover.py`) after every batch that can change it, and publishes the changes in
the router wire format (`kv_event_wire.py`) on an XPUB socket.

Convergence: the first message (seq 0) is ``AllBlocksCleared`` and the current cover; so is the answer
to every new subscription (XPUB sees it), so a router that starts late or reconnects starts from the
whole state. With ``replay_endpoint`` a ROUTER socket answers vllm-router's replay requests
(``[empty, start_seq]``, sent at its start and on a gap) with the published messages from ``start_seq``
on, kept in a bounded history (`replay_history`), then the end marker; a start older than the history
gets the full state under the latest sequence number instead (everything published so far is in it).
A router that sees the count restart (a replica restart) clears that replica by itself. After a cache
flush (`request_resync`) the next message is ``AllBlocksCleared`` and the cover that is left, so the
router drops the replica's blocks in one step rather than block by block.

The inbox is bounded (`max_pending_events`): a worker that outruns the fold for that long loses the
shadow's continuity, so the publisher clears the router's view once and stops publishing; every event
not published from then on is counted (`batches_dropped`, `events_dropped`) and shown in /metrics.
pyzmq is imported only when a publisher is made.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from typing import Any

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.resumable_cover import ResumableCover, Tier
from hybridcache.config import OptionError
from hybridcache.logs import get_logger
from hybridcache.persistence.kv_event_wire import (
    REPLAY_END_SEQ,
    AllBlocksCleared,
    EventBatch,
    KvEvent,
    encode_batch,
    seq_frame,
    wire_events,
)

log = get_logger(__name__)

DEFAULT_MAX_PENDING_EVENTS = 1 << 20
DEFAULT_REPLAY_HISTORY = 4096  # published batches kept for replays
IDLE_POLL_S = 1.0  # the thread sleeps in poll until an event, a subscription or a replay request
COALESCE_S = 0.005  # after a wake-up, events gather this long before a fold (fewer, larger batches)
KV_EVENTS_OFF_STATS: dict[str, object] = {
    "kv_events_batches_published": 0,
    "kv_events_batches_dropped": 0,
    "kv_events_events_dropped": 0,
    "kv_events_resyncs": 0,
    "kv_events_cpu_seconds": 0.0,
    "kv_events_device_blocks": 0,
    "kv_events_host_blocks": 0,
}

# Events after which the set of complete snapshots (or their tiers) may differ.
COVER_EVENTS = (
    ev.SnapshotPublished,
    ev.SnapshotDeleted,
    ev.SnapshotDeviceDropped,
    ev.SnapshotHostDropped,
    ev.SnapshotLoaded,
    ev.HostWriteLanded,
    ev.RestoreLanded,
    ev.DeviceCopiesDropped,
    ev.SubtreeDeleted,
    ev.NodeHostDropped,
    ev.PinnedHostCopiesDropped,
    ev.BlockMadeExact,  # drops an inexact host copy; makes a path exact (an exact-only cover grows)
)


class KvEventsUnavailable(OptionError):
    """pyzmq is missing or the endpoint cannot be bound; the message says which and what to do."""


class KvEventPublisher:
    """Looks like the facade's `journal` list (`append(event)`); `start()` begins publishing, `close()`
    ends it. Sockets are bound at construction so a taken port fails the start, not the first event."""

    def __init__(
        self,
        endpoint: str,
        geometry: CacheGeometry,
        replay_endpoint: str | None = None,
        topic: bytes = b"",
        max_pending_events: int = DEFAULT_MAX_PENDING_EVENTS,
        replay_history: int = DEFAULT_REPLAY_HISTORY,
        exact_only: bool = False,
    ) -> None:
        zmq = _import_zmq()
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topic = topic
        self.max_pending_events = max_pending_events
        self.batches_published = 0
        self.batches_dropped = 0
        self.events_dropped = 0
        self.resyncs = 0
        self.cpu_seconds = 0.0  # the publishing thread's CPU time so far
        self.lost = False
        self._zmq = zmq
        self._shadow = PrefixIndex(geometry)
        self._cover = ResumableCover(exact_only)  # an exact-only engine resumes only from exact entries
        self._seq = -1
        self._history: deque[tuple[int, bytes]] = deque(maxlen=replay_history)
        self._pending: list[ev.CacheEvent] = []
        self._resync_wanted = False
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._context = zmq.Context()
        self._pub = self._bind(zmq.XPUB, endpoint, "--kv-events")
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, even a repeated one, asks a resync
        self._replay = None
        if replay_endpoint is not None:
            self._replay = self._bind(zmq.ROUTER, replay_endpoint, "--kv-events-replay")
        # The worker wakes the thread through a pipe, once per batch (when the inbox was empty): an idle
        # publisher costs nothing, a busy one wakes at most once per COALESCE_S.
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)

    # -- the worker's side --------------------------------------------------------------------------
    def append(self, event: ev.CacheEvent) -> None:
        """Queue one applied event. Never blocks on anything but the inbox lock."""
        with self._lock:
            if self.lost:
                self.events_dropped += 1
                return
            first = not self._pending
            self._pending.append(event)
            if len(self._pending) > self.max_pending_events:
                self.lost = True
                self.batches_dropped += 1
                self.events_dropped += len(self._pending)
                self._pending = []
        if first:
            self._wake()

    def request_resync(self) -> None:
        """Publish ``AllBlocksCleared`` and the whole cover after the events queued so far (a flush)."""
        with self._lock:
            self._resync_wanted = True
        self._wake()

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the publishing thread (idempotent); its first message is the full state."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="hybridcache-kv-events", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Publish what is queued, stop the thread and close the sockets. Idempotent."""
        self._closing.set()
        if self._thread is not None:
            self._wake()
            self._thread.join(timeout=10)
            self._thread = None
        if not self._context.closed:
            self._context.destroy(linger=200)
            os.close(self._wake_read)
            os.close(self._wake_write)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # the pipe is full: a wake-up is already pending
            os.write(self._wake_write, b"\0")

    def stats(self) -> dict[str, object]:
        return {
            "kv_events_batches_published": self.batches_published,
            "kv_events_batches_dropped": self.batches_dropped,
            "kv_events_events_dropped": self.events_dropped,
            "kv_events_resyncs": self.resyncs,
            "kv_events_cpu_seconds": round(self.cpu_seconds, 6),
            "kv_events_device_blocks": self._cover.num_covered(Tier.DEVICE),
            "kv_events_host_blocks": self._cover.num_covered(Tier.HOST),
        }

    # -- the publisher's thread ---------------------------------------------------------------------
    def _run(self) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self._pub, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        if self._replay is not None:
            poller.register(self._replay, zmq.POLLIN)
        resync = True
        cleared_after_loss = False
        try:
            while True:
                closing = self._closing.is_set()
                ready = dict(poller.poll(0 if closing else int(IDLE_POLL_S * 1000)))
                if self._wake_read in ready:
                    self._drain_wake_pipe()
                    if not closing:
                        time.sleep(COALESCE_S)
                if self._pub in ready:
                    resync |= self._take_subscriptions()
                with self._lock:
                    batch, self._pending = self._pending, []
                    lost = self.lost
                    resync |= self._resync_wanted
                    self._resync_wanted = False
                if lost:
                    if not cleared_after_loss:
                        log.error("kv-events: the publisher fell %d events behind the worker; the router's "
                                  "view of this replica is cleared and no longer updated",
                                  self.max_pending_events)
                        self._send([AllBlocksCleared()])
                        cleared_after_loss = True
                elif batch and self._fold(batch):
                    changes = self._cover.update(self._shadow)
                    if changes and not resync:
                        self._send(wire_events(changes))
                if resync and not lost:
                    self._send_full_state()
                    resync = False
                if self._replay is not None and self._replay in ready:
                    self._answer_replays(lost)
                self.cpu_seconds = time.thread_time()
                if closing:
                    return
        except Exception:  # the publisher must never take the server down; the router falls back
            log.exception("kv-events publisher stopped")
            with self._lock:
                self.lost = True

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_read, 4096):
                pass
        except BlockingIOError:
            pass

    def _fold(self, batch: list[ev.CacheEvent]) -> bool:
        """Apply the batch to the shadow index; True when the cover may have changed."""
        changed = False
        try:
            for event in batch:
                self._shadow.apply(event)
                changed = changed or isinstance(event, COVER_EVENTS)
        except EventRejected as error:
            log.error("kv-events: the shadow index rejected an event (%s); publishing stops", error)
            with self._lock:
                self.lost = True
                self.events_dropped += len(batch)
            return False
        return changed

    def _take_subscriptions(self) -> bool:
        """Drain XPUB's subscription messages; True when one subscribed (rather than left)."""
        subscribed = False
        while True:
            try:
                message = self._pub.recv(self._zmq.NOBLOCK)
            except self._zmq.Again:
                return subscribed
            subscribed = subscribed or (message[:1] == b"\x01")

    def _send_full_state(self) -> None:
        self._cover.update(self._shadow)
        self._send([AllBlocksCleared(), *wire_events(self._cover.covered())])
        self.resyncs += 1

    def _send(self, events: list[KvEvent]) -> None:
        self._seq += 1
        payload = encode_batch(EventBatch(time.time(), events))
        self._pub.send_multipart([self.topic, seq_frame(self._seq), payload], copy=False)
        if self._replay is not None:
            self._history.append((self._seq, payload))
        self.batches_published += 1

    def _answer_replays(self, lost: bool) -> None:
        """Answer each replay request: the history from its start sequence number, or the full state
        under the latest one when the history no longer reaches back that far; then the end marker."""
        zmq = self._zmq
        while True:
            try:
                frames = self._replay.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            identity, start = frames[0], int.from_bytes(frames[-1][:8], "big", signed=True)
            reply = self._replay.send_multipart
            if lost:
                pass
            elif self._history and self._history[0][0] <= start:
                for seq, payload in self._history:
                    if seq >= start:
                        reply([identity, b"", self.topic, seq_frame(seq), payload])
            elif start <= self._seq:
                state = [AllBlocksCleared(), *wire_events(self._cover.covered())]
                payload = encode_batch(EventBatch(time.time(), state))
                reply([identity, b"", self.topic, seq_frame(self._seq), payload])
            reply([identity, b"", self.topic, seq_frame(REPLAY_END_SEQ), b""])

    def _bind(self, kind: int, endpoint: str, flag: str) -> Any:
        socket = self._context.socket(kind)
        socket.setsockopt(self._zmq.LINGER, 0)
        try:
            socket.bind(endpoint)
        except self._zmq.ZMQError as error:
            socket.close()
            self._context.destroy(linger=0)
            raise KvEventsUnavailable(flag, f"cannot bind {endpoint} ({error})") from error
        return socket


def _import_zmq() -> Any:
    try:
        import zmq
    except ImportError as error:
        raise KvEventsUnavailable(
            "--kv-events", "needs pyzmq: pip install 'hybridcache[router]' (or pip install pyzmq)"
        ) from error
    return zmq
