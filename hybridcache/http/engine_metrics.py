"""The engine's figures (``engine.stats()``, the body of /v1/cache/stats) as Prometheus metric families.

One name, one meaning: a figure keeps its /v1/cache/stats name in /metrics, prefixed with
``hybridcache:`` and, for a counter, suffixed with ``_total`` (Prometheus' convention). A figure whose
value in /v1/cache/stats is an object becomes one sample per key, the key as a label. Every name says its
unit (tokens, requests, bytes, blocks, events, snapshots). A figure the engine does not report reads 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "hybridcache:"


class Figure(NamedTuple):
    """One figure of ``engine.stats()``: its key, help text, and for an object-valued one the label name
    and the keys always exported (others the engine reports are exported too)."""

    key: str
    help: str
    label: str | None = None
    known: tuple[str, ...] = ()


COUNTERS = (
    Figure("prefix_cache_query_requests", "Requests admitted and looked up in the prefix cache."),
    Figure("prefix_cache_hit_requests", "Requests that reused at least one prompt token."),
    Figure("prefix_cache_query_tokens", "Prompt tokens of admitted requests (looked up in the cache)."),
    Figure("prefix_cache_hit_tokens", "Prompt tokens reused (not recomputed), by the tier they came from.",
           "source", ("device", "host")),
    Figure("prefix_cache_inserted_prompt_tokens",
           "Prompt tokens, in whole 64-token blocks, that requests added to the prefix cache."),
    Figure("prefix_cache_eviction_events", "Cache eviction events, by tier.", "tier", ("device", "host")),
    Figure("prefill_tokens", "Prompt tokens computed by prefill (the ones not reused)."),
    Figure("output_tokens", "Tokens generated."),
    Figure("requests_finished", "Requests the engine finished (any reason)."),
    Figure("host_tier_restored_bytes", "Bytes copied from the Host tier to the device for reuse."),
    Figure("host_tier_written_bytes", "Bytes copied from the device to the Host tier."),
    Figure("host_tier_written_back_blocks", "KV blocks written to the Host tier when device eviction "
           "would have lost them (write-back)."),
    Figure("prefetched_blocks", "KV blocks copied from the Host tier ahead of their use."),
    Figure("snapshot_taps_taken", "Recurrent-state snapshots (taps) taken during prefill."),
    Figure("snapshot_taps_in_pass",
           "Taps copied from inside a prefill pass without splitting it (the prompt tail, hedges)."),
    Figure("snapshot_taps_skipped", "Planned taps skipped."),
    Figure("endpoint_refill_tokens",
           "Tokens re-prefilled while idle to make decode-produced blocks and snapshots exact."),
    Figure("endpoint_refills_finished", "Idle-time re-prefills of finished requests completed."),
    Figure("endpoint_refills_preempted", "Idle-time re-prefills cancelled because a request arrived."),
    Figure("blocks_made_exact", "Decode-produced KV blocks whose copies an exact prefill replaced."),
    Figure("snapshot_taps_skipped_no_slot", "Taps skipped for want of a free device snapshot slot."),
    Figure("endpoint_snapshots_skipped", "Request-end snapshots not kept."),
    Figure("hedge_host_writes_refused", "Hedge snapshots kept off the Host tier: no room worth less than "
           "them, or the hedge budget (--cache-hedge-budget) full of hedges worth more."),
    Figure("journal_write_errors",
           "Failed writes of the event journal (--event-log); journaling stops at the first."),
    Figure("kv_events_batches_published", "KV-event batches published to routers (--kv-events)."),
    Figure("kv_events_batches_dropped",
           "KV-event batches dropped because the publisher fell behind the worker (it then stops)."),
    Figure("kv_events_events_dropped", "Cache events never published to routers (--kv-events)."),
    Figure("kv_events_cpu_seconds", "CPU seconds of the KV-event publisher's thread (--kv-events)."),
    Figure("worker_stalls_over_100ms", "Times the event loop (the worker) was blocked for over 100 ms."),
    Figure("cache_dir_batches", "Batches of host writes made durable in the cache directory (--cache-dir)."),
    Figure("cache_dir_records", "Records appended to the cache directory's contents journal."),
    Figure("cache_dir_compactions", "Rewrites of the contents journal as a base table."),
    Figure("cache_dir_sync_seconds", "Seconds in fdatasync (slab file and contents) over every batch."),
    Figure("cache_dir_bytes_appended", "Bytes appended to the contents journal by batches."),
)

GAUGES = (
    Figure("requests_running", "Requests holding a lane."),
    Figure("requests_waiting", "Requests queued for admission."),
    Figure("endpoint_refills_pending", "Finished requests waiting for idle time to be re-prefilled."),
    Figure("endpoint_refills_running", "Idle-time re-prefills holding a lane."),
    Figure("prefix_cache_nodes", "Blocks (nodes) in the prefix tree."),
    Figure("prefix_cache_snapshots", "Recurrent-state snapshots in the prefix cache."),
    Figure("device_pages_total", "Device KV pages (64 tokens each)."),
    Figure("device_pages_free", "Device KV pages free."),
    Figure("host_tier_capacity_bytes", "Host tier size in bytes."),
    Figure("host_tier_bytes", "Host tier bytes in use by kind; the kinds add up to the bytes in use.",
           "kind", ("kv_live", "kv_dead", "snapshot_images", "snapshot_tails")),
    Figure("host_tier_superseded_snapshot_bytes",
           "Host bytes of snapshots a later one superseded (part of host_tier_bytes)."),
    Figure("host_tier_hedge_snapshot_bytes",
           "Host bytes of hedge snapshots, taken a few hundred tokens before prompt ends "
           "(part of host_tier_bytes)."),
    Figure("host_tier_hedge_budget_bytes",
           "Host bytes hedge images may hold together (--cache-hedge-budget)."),
    Figure("snapshot_image_bytes", "Bytes of one recurrent-state image (device slot or host slabs)."),
    Figure("snapshot_image_pending_tail_bytes",
           "Bytes of one image that hold a pending tail: the Gated DeltaNet layer inputs since the block "
           "boundary, which make a snapshot inside a block bit-exact (part of snapshot_image_bytes)."),
    Figure("host_tier_pending_tail_bytes",
           "Host bytes of the pending-tail parts of host-resident images (part of host_tier_bytes)."),
    Figure("host_writes_in_flight", "Host writes issued and not yet landed."),
    Figure("kv_events_device_blocks", "Blocks routers are told this replica resumes from the device."),
    Figure("kv_events_host_blocks", "Blocks routers are told this replica resumes from the Host tier."),
    Figure("worker_stall_max_seconds",
           "The longest time the event loop (the worker's bookkeeping, every stream) was blocked."),
    Figure("worker_stall_max_cpu_seconds",
           "The event loop thread's CPU time during that longest stall (near it: code blocked the loop; "
           "far below: the thread waited for the GIL or a CPU)."),
    Figure("worker_stall_max_process_cpu_seconds",
           "Every thread's CPU time during that longest stall (near it: the GIL was held elsewhere; "
           "far below: the process was not scheduled)."),
    Figure("worker_lanes_free", "Engine lanes free (all of them when no request runs)."),
    Figure("pinned_blocks", "Blocks pinned by a running request or a transfer (0 when idle)."),
    Figure("pinned_snapshots", "Snapshots pinned by an admission or a transfer (0 when idle)."),
    Figure("cache_lanes", "Lanes open in the cache index (0 when idle)."),
    Figure("lane_private_pages", "Device pages private to a running lane (0 when idle)."),
    Figure("restores_in_flight", "Host-to-device restore batches not yet landed."),
    Figure("host_slabs_used", "Host tier slabs in use."),
    Figure("host_tier_fallback_chunks",
           "Host tier chunks the allocator refused mid-run, held by an anonymous mapping instead."),
    Figure("cache_event_seq", "Sequence number of the last cache event applied."),
    Figure("cache_dir_durable_seq",
           "Event sequence up to which every landed host write is durable in the cache directory."),
    Figure("cache_dir_contents_bytes", "Size of the cache directory's contents journal."),
    Figure("cache_dir_sync_seconds_max", "The longest batch's fdatasync pair (slab file and contents)."),
    Figure("cache_dir_restored", "What the last start restored from the cache directory, by count.",
           "count"),
)


class EngineStatsCollector(Collector):
    """Reads ``stats()`` at each scrape and yields its figures; holds no state of its own."""

    def __init__(self, stats: Callable[[], Mapping[str, object]], model_name: str) -> None:
        self._stats = stats
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        for figure in COUNTERS:
            yield self._family(CounterMetricFamily, figure, stats)
        for figure in GAUGES:
            yield self._family(GaugeMetricFamily, figure, stats)

    def _family(self, kind: type[CounterMetricFamily] | type[GaugeMetricFamily], figure: Figure,
                stats: Mapping[str, object]) -> Metric:
        name = PREFIX + figure.key
        if figure.label is None:
            family = kind(name, figure.help, labels=["model_name"])
            family.add_metric([self._model_name], _number(stats.get(figure.key)))
            return family
        family = kind(name, figure.help, labels=["model_name", figure.label])
        values = stats.get(figure.key)
        values = values if isinstance(values, Mapping) else {}
        for label in [*figure.known, *sorted(str(key) for key in values if key not in figure.known)]:
            family.add_metric([self._model_name, label], _number(values.get(label)))
        return family


def _number(value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, int | float) else 0.0
