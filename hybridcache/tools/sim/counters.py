"""What a simulation counts, and the journal stand-in that counts evictions by tier.

Evictions, by the event that carries them: ``evicted_device_blocks`` (device copies of blocks and
snapshot tails dropped, the host copy kept), ``evicted_device_snapshot_images`` (a snapshot's slot
freed, its host image kept), ``evicted_host_blocks`` (dead-KV host copies dropped),
``dropped_pinned_host_copies`` (host copies of blocks a running lane pins on the device, freed),
``evicted_host_snapshot_images`` (a host image dropped, the device copy kept), ``deleted_subtrees``
(a block lost its last copy and took its subtree along: device LRU without a host copy, or the ``lru``
policy's host eviction) and ``deleted_snapshots`` (a snapshot lost every copy). Counts are exact
integers over the run; ``SimCounters`` is mutated by the driver and the tally only.

Reuse and restores keep KV and recurrent state apart: a request can resume from a snapshot whose image
the device had dropped (``restored_state_bytes`` > 0) while every block it stands on is still on the
device (``reused_tokens_host_kv`` 0), which is what the ``lru`` baseline does most.
"""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

import msgspec

from hybridcache.cache import events as ev


class SimCounters(msgspec.Struct, kw_only=True):
    """Running totals of one simulation. Mutable (the driver adds to it)."""

    requests: int = 0
    requests_infeasible: int = 0
    requests_truncated: int = 0
    echoed_requests: int = 0
    input_tokens: int = 0
    computed_tokens: int = 0
    reused_tokens_device_kv: int = 0  # reused prompt tokens whose KV was still on the device
    reused_tokens_host_kv: int = 0  # reused prompt tokens whose KV (blocks, tail) came from the host
    generated_tokens: int = 0
    restored_kv_bytes: int = 0  # KV blocks and snapshot tails copied from the host
    restored_state_bytes: int = 0  # recurrent-state snapshot images copied from the host
    host_resumed_requests: int = 0  # requests that copied anything from the host
    resumed_from_snapshot: int = 0
    taps_taken: int = 0
    taps_skipped: int = 0
    hedges_taken: int = 0  # HEDGE taps given a slot (cache/hedge_admission.py)
    hedge_writes_refused: int = 0  # hedge images kept off the host: no room worth less, or the budget
    hedge_host_bytes_peak: int = 0  # most host bytes hedge images held at once (sampled at each finish)
    endpoints: int = 0
    evicted_device_blocks: int = 0
    evicted_device_snapshot_images: int = 0
    evicted_host_blocks: int = 0
    dropped_pinned_host_copies: int = 0
    deleted_subtrees: int = 0
    evicted_host_snapshot_images: int = 0
    deleted_snapshots: int = 0
    model_prefill_seconds: float = 0.0
    excess_capacity_tokens: int = 0  # computed past the bound: a snapshot once stood nearer (sim/excess.py)
    excess_placement_tokens: int = 0  # computed past the bound: no snapshot was ever taken nearer
    excess_capacity_requests: int = 0
    excess_placement_requests: int = 0
    # the capacity share by how long the request's conversation had been idle (sim/excess.py)
    excess_capacity_tokens_first_request: int = 0
    excess_capacity_tokens_idle_under_5m: int = 0
    excess_capacity_tokens_idle_5_to_30m: int = 0
    excess_capacity_tokens_idle_over_30m: int = 0


def count_eviction(counters: SimCounters, event: ev.CacheEvent) -> None:
    """Add ``event``'s evictions to ``counters`` (no-op for other events). Mutates counters."""
    field = _EVICTION_FIELDS.get(type(event))
    if field is None:
        return
    if isinstance(event, ev.DeviceCopiesDropped):
        amount = len(event.nodes) + len(event.tails)
    elif isinstance(event, ev.PinnedHostCopiesDropped):
        amount = len(event.nodes)
    else:
        amount = 1
    setattr(counters, field, getattr(counters, field) + amount)


_EVICTION_FIELDS = MappingProxyType(
    {
        ev.DeviceCopiesDropped: "evicted_device_blocks",
        ev.SnapshotDeviceDropped: "evicted_device_snapshot_images",
        ev.NodeHostDropped: "evicted_host_blocks",
        ev.PinnedHostCopiesDropped: "dropped_pinned_host_copies",
        ev.SubtreeDeleted: "deleted_subtrees",
        ev.SnapshotHostDropped: "evicted_host_snapshot_images",
        ev.SnapshotDeleted: "deleted_snapshots",
    }
)


class EvictionTally:
    """A journal stand-in for ``Cache(journal=...)``: counts evictions instead of keeping events."""

    __slots__ = ("counters", "on_published")

    def __init__(self, counters: SimCounters) -> None:
        self.counters = counters
        self.on_published: Callable[[ev.SnapshotPublished], None] | None = None  # sim/excess.py's record

    def append(self, event: ev.CacheEvent) -> None:
        """Count ``event`` (mutates the counters); hand a publication to ``on_published``."""
        count_eviction(self.counters, event)
        if self.on_published is not None and isinstance(event, ev.SnapshotPublished):
            self.on_published(event)
