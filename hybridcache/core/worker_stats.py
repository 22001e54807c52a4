"""Engine counters for metrics: hits, misses, reused tokens by source, bytes moved. Not cache state."""

from __future__ import annotations

from hybridcache.core.api import RequestAccounting


class WorkerCounters:
    """Mutated by the worker only; read as a dict snapshot."""

    def __init__(self) -> None:
        self.queries = 0
        self.hits = 0
        self.query_tokens = 0
        self.reused_tokens = {"device": 0, "host": 0}
        self.restored_bytes = 0
        self.written_bytes = 0
        self.written_back_blocks = 0  # written to the host on eviction (write-back), a subset of the bytes
        self.prefill_tokens = 0
        self.output_tokens = 0
        self.requests_finished = 0
        self.taps_taken = 0
        self.taps_skipped = 0
        self.taps_in_pass = 0  # hedge taps copied from inside a prefill pass (no split of the pass)
        self.prefetched_blocks = 0
        self.inserted_prompt_tokens = 0
        self.refill_tokens = 0  # prefilled by endpoint refills (core/endpoint_refills.py), not prefill_tokens
        self.refills_finished = 0
        self.refills_preempted = 0
        self.blocks_made_exact = 0  # inexact blocks whose copies an exact prefill replaced

    def admitted(self, accounting: RequestAccounting) -> None:
        self.queries += 1
        self.query_tokens += accounting.prompt_tokens
        if accounting.reuse_tokens > 0 and accounting.source != "root":
            self.hits += 1
            self.reused_tokens[accounting.source] += accounting.reuse_tokens
        self.restored_bytes += accounting.restored_host_bytes

    def finished(self, accounting: RequestAccounting) -> None:
        self.requests_finished += 1
        self.output_tokens += accounting.output_tokens
        self.taps_taken += accounting.taps_taken
        self.taps_skipped += accounting.taps_skipped
        self.inserted_prompt_tokens += accounting.inserted_prompt_tokens

    def as_dict(self) -> dict[str, object]:
        """The counters under the names /v1/cache/stats and /metrics use (http/engine_metrics.py)."""
        return {
            "prefix_cache_query_requests": self.queries,
            "prefix_cache_hit_requests": self.hits,
            "prefix_cache_query_tokens": self.query_tokens,
            "prefix_cache_hit_tokens": dict(self.reused_tokens),
            "prefix_cache_inserted_prompt_tokens": self.inserted_prompt_tokens,
            "host_tier_restored_bytes": self.restored_bytes,
            "host_tier_written_bytes": self.written_bytes,
            "host_tier_written_back_blocks": self.written_back_blocks,
            "prefill_tokens": self.prefill_tokens,
            "output_tokens": self.output_tokens,
            "requests_finished": self.requests_finished,
            "snapshot_taps_taken": self.taps_taken,
            "snapshot_taps_skipped": self.taps_skipped,
            "snapshot_taps_in_pass": self.taps_in_pass,
            "prefetched_blocks": self.prefetched_blocks,
            "endpoint_refill_tokens": self.refill_tokens,
            "endpoint_refills_finished": self.refills_finished,
            "endpoint_refills_preempted": self.refills_preempted,
            "blocks_made_exact": self.blocks_made_exact,
        }
