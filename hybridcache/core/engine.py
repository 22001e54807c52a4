"""The engine: one asyncio worker that owns every mutation of the cache and the pools (spec §4, §8.2).

`submit()` and `cancel()` are the only ways in (see `core.api`). The worker runs units — an admission,
one lane's prefill pass, one batched decode round — and between units it applies completions posted by
transfer waiters. The model's blocking forward runs on a dedicated executor thread so the event loop
stays responsive; cache mutations happen on the worker only.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.facade import Cache
from hybridcache.cache.integrity import check_integrity
from hybridcache.config import EffectiveOptions
from hybridcache.core.api import PreparedPrompt, RequestError
from hybridcache.core.cache_report import device_counts, host_tier_composition
from hybridcache.core.requests import Request, RequestStream
from hybridcache.core.runtime import ModelRuntime
from hybridcache.core.sampling_params import SamplingParams
from hybridcache.core.tokenizer import Tokenizer
from hybridcache.core.worker import Worker
from hybridcache.logs import get_logger
from hybridcache.persistence.event_sink import open_journal

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
        self.runtime = ModelRuntime(self.model_dir, options)
        self.max_model_len = self.runtime.max_model_len
        self.eos_token_ids = tuple(
            dict.fromkeys(
                (*Tokenizer.from_dir(self.model_dir).eos_token_ids, *self.runtime.model.config.eos_token_ids)
            )
        )
        self.journal = None
        if options.cache.event_log is not None:
            self.journal = open_journal(
                options.cache.event_log,
                str(self.model_dir.resolve()),
                self.runtime.geometry,
                {"prefill_chunk": options.prefill_chunk, "max_concurrency": options.max_concurrency},
            )
        self.cache = Cache(self.runtime.geometry, CacheCostModel.default(), journal=self.journal)
        self.debug_integrity = debug_integrity
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hybridcache-compute")
        self._ids = itertools.count(1)
        self._worker: Worker | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker task on the running loop. Idempotent."""
        if self._task is not None:
            return
        self._worker = Worker(self, self._compute)
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
        await self._worker.drain_transfers()
        self._compute.shutdown(wait=True)
        if self.journal is not None:
            self.cache.checkpoint()
            self.journal.writer.close()
        self.runtime.close()

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

    # -- reporting ----------------------------------------------------------------------------------
    def stats(self) -> dict[str, object]:
        """Counters for /metrics and /v1/cache/stats (a snapshot; reading only)."""
        worker = self._worker
        index = self.cache.index
        running = 0 if worker is None else len(worker.lanes)
        waiting = 0 if worker is None else len(worker.queue)
        stats: dict[str, object] = {
            "requests_running": running,
            "requests_waiting": waiting,
            "stopping": bool(worker and worker.stopping) or self._failure is not None,
            "nodes": len(index.nodes) - 1,
            "snapshots": len(index.snapshots),
            "device_pages_total": self.runtime.num_pages,
            "device_pages_free": index.num_free_pages,
            "evictions": {
                "device": self.cache.stats.evicted_device_events,
                "host": self.cache.stats.evicted_host_events,
            },
            "taps_skipped_no_slot": self.cache.stats.taps_skipped_no_slot,
            "endpoints_skipped": self.cache.stats.endpoints_skipped,
            "host_tier_capacity_bytes": self.options.cache.host_cache_bytes,
            "host_tier_bytes": host_tier_composition(index),
            **device_counts(index),
        }
        if worker is not None:
            stats.update(worker.counters.as_dict())
        return stats

    def check_integrity(self) -> None:
        """Rebuild every derived counter of the index and compare (raises IntegrityError)."""
        check_integrity(self.cache.index)
