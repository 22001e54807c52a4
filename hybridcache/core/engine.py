"""The engine: one asyncio worker that owns every mutation of the cache and the pools (spec §4, §8.2).

`submit()` and `cancel()` are the only ways in (see `core.api`). The worker runs units — an admission,
one lane's prefill pass, one batched decode round — and between units it applies completions posted by
transfer waiters. The model's blocking forward runs on a dedicated executor thread so the event loop
stays responsive; cache mutations happen on the worker only.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import msgspec

from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.facade import Cache
from hybridcache.cache.hedge_admission import resolve_hedge_budget
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.records import SnapshotKind
from hybridcache.config import EffectiveOptions
from hybridcache.core.api import PreparedPrompt, RequestError
from hybridcache.core.cache_report import (
    device_counts,
    host_images,
    host_tier_composition,
    snapshot_host_bytes,
    superseded_snapshot_bytes,
)
from hybridcache.core.loop_stall import LoopStallMonitor
from hybridcache.core.occupancy import occupancy_counts
from hybridcache.core.requests import Request, RequestStream
from hybridcache.core.runtime import ModelRuntime, resolve_device
from hybridcache.core.sampling_params import SamplingParams
from hybridcache.core.tokenizer import Tokenizer
from hybridcache.core.worker import Worker
from hybridcache.logs import Progress, get_logger
from hybridcache.persistence.cache_dir import CACHE_DIR_OFF_STATS, CacheDirectory
from hybridcache.persistence.contents_writer import DEFAULT_COMPACT_MIN_TAIL
from hybridcache.persistence.event_fanout import fan_out
from hybridcache.persistence.event_sink import open_journal
from hybridcache.persistence.fingerprint import make_fingerprint
from hybridcache.persistence.kv_event_publisher import KV_EVENTS_OFF_STATS, KvEventPublisher
from hybridcache.persistence.load import load_prefix_cache
from hybridcache.persistence.save import save_prefix_cache

T = TypeVar("T")

log = get_logger(__name__)


class Engine:
    """Serves one checkpoint. Construct, `await start()`, submit requests, `await stop()`."""

    def __init__(
        self,
        model_dir: str | Path,
        options: EffectiveOptions,
        model_name: str | None = None,
        debug_integrity: bool = False,
    ) -> None:
        self.options = options
        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridcache-compute")
        try:
            self.runtime = self._load_runtime(options)
        except BaseException:
            self._compute.shutdown(wait=False)
            raise
        self.max_model_len = self.runtime.max_model_len
        # Loaded once: a frontend built with `Frontend.from_dir(..., tokenizer=engine.tokenizer)` shares it
        # (a 248k-token vocabulary takes 0.8 s and 80 MiB to load, and 180 MiB while it loads).
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        self.eos_token_ids = tuple(
            dict.fromkeys((*self.tokenizer.eos_token_ids, *self.runtime.model.config.eos_token_ids))
        )
        self.journal = None
        if options.cache.event_log is not None:
            self.journal = open_journal(
                options.cache.event_log,
                str(self.model_dir.resolve()),
                self.runtime.geometry,
                {"prefill_chunk": options.prefill_chunk, "max_concurrency": options.max_concurrency},
            )
        self.kv_events = None
        if options.cache.kv_events is not None:
            self.kv_events = KvEventPublisher(
                options.cache.kv_events,
                self.runtime.geometry,
                options.cache.kv_events_replay,
                exact_only=options.cache.exact_resume,
            )
        self.cache = Cache(
            self.runtime.geometry,
            CacheCostModel.default(),
            journal=fan_out(self.journal, self.kv_events),
            host_write=options.cache.host_write,
            hedge_budget_bytes=resolve_hedge_budget(options.cache.hedge_budget, self.runtime.geometry),
            keep_backed_device_images=self.runtime.keep_device_snapshot_copies,
        )
        self.abandon_save = threading.Event()  # set by a further Ctrl+C: the save stops, the old file stays
        self.save_finished = threading.Event()
        self._fingerprint = None
        if options.cache.prefix_cache_file is not None:
            self._fingerprint = engine_fingerprint(self.model_dir, self.runtime, options)
            self._load_prefix_cache(options.cache.prefix_cache_file)
        self.cache_dir: CacheDirectory | None = None
        if options.cache.cache_dir is not None:
            self._open_cache_dir(options.cache.cache_dir)
        self.debug_integrity = debug_integrity
        self._ids = itertools.count(1)
        self._worker: Worker | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self.loop_stalls = LoopStallMonitor()

    def _load_runtime(self, options: EffectiveOptions) -> ModelRuntime:
        """On a CPU, load the model on the compute thread that will run it, so the process's torch work
        stays on one OpenMP team (a second team, even idle, makes every team sleep between parallel regions:
        `gpu/openmp_threads.py`). On a GPU, load it here, where the CUDA context is made current."""
        if resolve_device(options.device).type == "cpu":
            return self._compute.submit(ModelRuntime, self.model_dir, options).result()
        return ModelRuntime(self.model_dir, options)

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker task on the running loop; the event log begins to be written (a previous
        run's journal is rotated away only now, so a start that fails earlier leaves it as it was).
        Idempotent."""
        if self._task is not None:
            return
        if self.journal is not None:
            self.journal.writer.release()
        if self.kv_events is not None:
            self.kv_events.start()
        self._worker = Worker(self, self._compute)
        self.loop_stalls.start()
        self._task = asyncio.create_task(self._worker.run(), name="hybridcache-worker")
        self._task.add_done_callback(self._worker_ended)

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()
            log.error("engine worker failed: %r", self._failure)

    async def stop(self) -> None:
        """Orderly stop: queued and running requests fail as unavailable at the next unit boundary, every
        lane is released, transfers drain. Idempotent."""
        if self._task is None or self._worker is None:
            return
        self._worker.request_stop()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.loop_stalls.stop()
        await self._worker.drain_transfers()
        self._compute.shutdown(wait=True)
        if self._fingerprint is not None and self._failure is None:
            await asyncio.get_running_loop().run_in_executor(None, self._save_prefix_cache)
        self.save_finished.set()
        try:
            if self.journal is not None:
                self.cache.checkpoint()
                self._close_journal()
        finally:
            try:
                if self.kv_events is not None:
                    self.kv_events.close()
                if self.cache_dir is not None:  # every host write has landed: the last batch is written
                    self.cache_dir.close()
            finally:
                self.runtime.close()

    def _close_journal(self) -> None:
        assert self.journal is not None
        try:
            self.journal.writer.close()
        except OSError as error:  # already logged when it happened; the stop goes on
            log.error("%s (the journal ends before the stop)", error)

    # -- the prefix-cache file (§5.5) --------------------------------------------------------------
    def _open_cache_dir(self, directory: str) -> None:
        """Restore the host tier from the directory, then follow every host-tier change durably (the
        directory's sink joins the event journal on the facade's event stream)."""
        fingerprint = engine_fingerprint(self.model_dir, self.runtime, self.options)
        self.cache_dir = CacheDirectory(
            directory, self.cache, self.runtime.host_memory, fingerprint,
            # crash trials (tools/crash_trials.py) compact often and widen the rename window:
            compact_min_tail=int(os.environ.get("HYBRIDCACHE_COMPACT_MIN_TAIL", DEFAULT_COMPACT_MIN_TAIL)),
            compaction_pause_s=float(os.environ.get("HYBRIDCACHE_COMPACTION_PAUSE_S", 0.0)),
            compact_tail_ratio=float(os.environ.get("HYBRIDCACHE_COMPACT_TAIL_RATIO", 2.0)),
        )
        self.cache.journal = fan_out(self.journal, self.cache_dir.sink, self.kv_events)

    def _load_prefix_cache(self, path: str) -> None:
        size = os.path.getsize(path) if os.path.isfile(path) else 0
        progress = Progress(log, "loading prefix cache", size, unit="bytes")
        report = load_prefix_cache(
            path, self.cache, self.runtime.host_memory, self._fingerprint, progress.update
        )
        if report.status in ("restored", "partial"):
            progress.finish()
        (log.info if report.status in ("restored", "absent") else log.warning)("%s", report.message)

    def _save_prefix_cache(self) -> None:
        """In the orderly stop, after every host write landed (runs on a helper thread)."""
        path = self.options.cache.prefix_cache_file
        assert path is not None and self._fingerprint is not None
        try:
            report = save_prefix_cache(
                path, self.cache.index, self.runtime.host_memory, self._fingerprint, self.abandon_save
            )
        except OSError as error:
            log.error("prefix cache not saved to %s: %s (the previous file is intact)", path, error)
            return
        log.info("%s", report.message)

    # -- requests -----------------------------------------------------------------------------------
    def submit(
        self, prompt: PreparedPrompt, sampling: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Queue a request; iterate the returned stream for its outputs (see `core.api`)."""
        request_id = request_id or f"req-{next(self._ids)}"
        stream = RequestStream(request_id, self.cancel)
        request = Request(request_id, prompt, sampling, stream, time.monotonic())
        worker = self._worker
        if worker is None or self._failure is not None or worker.stopping:
            request.fail(RequestError("unavailable", "the engine is not running"))
        elif prompt.num_tokens + 1 > self.max_model_len:
            request.fail(
                RequestError(
                    "too_long",
                    f"the prompt has {prompt.num_tokens} tokens; the context is {self.max_model_len}",
                )
            )
        else:
            worker.post_submit(request)
        return stream

    def cancel(self, request_id: str) -> None:
        """Cancel a queued or running request at the next unit boundary. Unknown ids are ignored."""
        if self._worker is not None:
            self._worker.post_cancel(request_id)

    async def settle(self, timeout_s: float = 60.0) -> bool:
        """Wait until the worker has no request and no idle-time work (endpoint refills) left; False when
        ``timeout_s`` passed first or the engine is not running. Reads only (polls every 5 ms)."""
        deadline = time.monotonic() + timeout_s
        while (worker := self._worker) is not None and self._failure is None and not worker.stopping:
            if not (worker.queue or worker.lanes or worker.refills.pending or worker.inbox_pending):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.005)
        return False

    async def flush_cache(self) -> int:
        """Drop every cached prefix no running request holds, and the endpoint refills (idle-time work on
        what is going); a running request keeps its path and finishes normally, and what it publishes later
        is cached as usual. Copies in flight when the flush is asked for land first (a block being copied
        cannot be deleted). Then the router gets ``AllBlocksCleared`` and what is left. Returns how many
        subtrees went; raises RequestError("unavailable") when the engine is not running."""
        worker = self._worker
        if worker is None or self._failure is not None or worker.stopping:
            raise RequestError("unavailable", "the engine is not running")
        await self._on_worker(worker, worker.refills.drop_all)  # a cancelled refill may start host copies
        await worker.transfers_landed()
        try:
            count = await self._on_worker(worker, self.cache.flush_unpinned)
        except Exception as error:  # the worker fails on it too: the index is no longer trusted
            raise RequestError("internal", f"the cache flush failed: {error}") from error
        if self.kv_events is not None:
            self.kv_events.request_resync()
        log.info("prefix cache flushed: %d subtrees dropped", count)
        return count

    @staticmethod
    async def _on_worker(worker: Worker, action: Callable[[], T]) -> T:
        """Run ``action`` on the worker between two units (it owns the cache) and return its result; an
        exception is raised here and on the worker (which then fails: its state is no longer trusted)."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()

        def run() -> None:
            try:
                result = action()
            except BaseException as error:
                if not done.done():
                    done.set_exception(error)
                raise
            if not done.done():
                done.set_result(result)

        worker.post(run)
        return await done

    # -- reporting ----------------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        """Counters for /metrics and /v1/cache/stats (a snapshot; reading only)."""
        worker = self._worker
        index = self.cache.index
        lanes = [] if worker is None else list(worker.lanes.values())
        refilling = sum(lane.request.internal for lane in lanes)
        waiting = 0 if worker is None else len(worker.queue)
        stats: dict[str, object] = {
            "requests_running": len(lanes) - refilling,
            "requests_waiting": waiting,
            # idle-time work (core/endpoint_refills.py): jobs waiting, and the one running
            "endpoint_refills_pending": 0 if worker is None else len(worker.refills.pending),
            "endpoint_refills_running": refilling,
            "stopping": bool(worker and worker.stopping) or self._failure is not None,
            "prefix_cache_nodes": len(index.nodes) - 1,
            "prefix_cache_snapshots": len(index.snapshots),
            "device_pages_total": self.runtime.num_pages,
            "device_pages_free": index.num_free_pages,
            "prefix_cache_eviction_events": {
                "device": self.cache.stats.evicted_device_events,
                "host": self.cache.stats.evicted_host_events,
            },
            "snapshot_taps_skipped_no_slot": self.cache.stats.taps_skipped_no_slot,
            "endpoint_snapshots_skipped": self.cache.stats.endpoints_skipped,
            "host_tier_capacity_bytes": self.options.cache.host_cache_bytes,
            "host_tier_bytes": host_tier_composition(index),
            "host_tier_superseded_snapshot_bytes": superseded_snapshot_bytes(index),
            **device_counts(index),
            **occupancy_counts(index),
            "worker_lanes_free": 0 if worker is None else len(worker.free_lanes),
            "host_tier_fallback_chunks": self.runtime.host_memory.fallback_chunks,
            **self.loop_stalls.stats(),
            **self._journal_stats(),
            **(KV_EVENTS_OFF_STATS if self.kv_events is None else self.kv_events.stats()),
            "cache_event_seq": index.seq,
        }
        stats.update(CACHE_DIR_OFF_STATS if self.cache_dir is None else self.cache_dir.stats())
        if worker is not None:
            stats.update(worker.counters.as_dict())
        hedges = [snap.id for snap in index.snapshots.values() if snap.kind == SnapshotKind.HEDGE]
        stats["host_tier_hedge_snapshot_bytes"] = snapshot_host_bytes(index, hedges)
        stats["host_tier_hedge_budget_bytes"] = self.cache.hedge_budget_bytes
        stats["hedge_host_writes_refused"] = self.cache.stats.hedge_writes_refused
        floor = self.cache.recency_floor
        # The worker's clock, read now: the time it last gave the cache goes stale while it idles.
        stats["host_tier_recency_floor_on"] = floor.is_on(time.monotonic())
        stats["host_tier_recency_floor_switched_on"] = floor.switched_on
        states = self.runtime.states
        stats["snapshot_image_bytes"] = states.image_bytes
        stats["snapshot_image_pending_tail_bytes"] = states.tail_bytes()
        stats["host_tier_pending_tail_bytes"] = host_images(index) * states.tail_bytes()
        return stats

    def _journal_stats(self) -> dict[str, object]:
        """`journal_write_errors` (a counter for /metrics) and `journal_error` (the message, or None:
        /health reports the server degraded while it is set). Zero and None without an event log."""
        if self.journal is None:
            return {"journal_write_errors": 0, "journal_events_dropped": 0, "journal_error": None}
        writer = self.journal.writer
        failed = writer.failed
        return {
            "journal_write_errors": writer.write_errors,
            "journal_events_dropped": writer.events_dropped,
            "journal_error": None if failed is None else f"event journal {writer.path}: {failed}",
        }

    def check_integrity(self) -> None:
        """Rebuild every derived counter of the index and compare (raises IntegrityError)."""
        check_integrity(self.cache.index)


def engine_fingerprint(model_dir: Path, runtime: ModelRuntime, options: EffectiveOptions):
    """What a prefix-cache file of this engine is valid for: checkpoint, numerics, KV layout, build."""
    config = runtime.model.config
    kv_layout = {"plane_page_bytes": runtime.kv.plane_page_bytes, "layers": list(runtime.kv.layers)}
    rope = {"theta": config.rope_theta, "partial_rotary_factor": config.partial_rotary_factor}
    return make_fingerprint(
        model_dir,
        msgspec.to_builtins(config),
        str(runtime.model.dtype),
        kv_layout,
        rope,
        {"prefill_chunk": options.prefill_chunk},
    )
