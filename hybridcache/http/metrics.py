"""``GET /metrics``: the Prometheus exposition, from `prometheus_client` with one registry per app.

Two sources:

- the engine's figures, read from ``engine.stats()`` at each scrape (`EngineStatsCollector`): the same
  names and values as /v1/cache/stats (prefix-cache queries and hits in tokens and in requests, reuse by
  tier, host-tier bytes, evictions, taps, ...);
- what only the HTTP layer sees, measured here per request: requests finished by finish reason
  (including those cancelled before the engine admitted them), refusals by HTTP status, and the
  time-to-first-token and inter-token-latency histograms.

`ServerMetrics` mutates only itself (one per app, on the event loop); there is no global registry.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from hybridcache.http.engine_metrics import PREFIX, EngineStatsCollector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


class ServerMetrics:
    """The app's metrics registry: HTTP-side counters and histograms, plus the engine's figures read at
    scrape time. Mutates itself; used from the event loop only."""

    def __init__(self, engine_stats: Callable[[], Mapping[str, object]], model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._model = model_name
        self._finished = Counter(
            PREFIX + "http_requests_finished", "HTTP requests answered, by finish reason.",
            ["model_name", "finish_reason"], registry=self.registry)
        self._errors = Counter(
            PREFIX + "http_request_errors", "Refused requests, by HTTP status.", ["model_name", "status"],
            registry=self.registry)
        self._ttft = Histogram(
            PREFIX + "time_to_first_token_seconds", "Time from request arrival to its first token.",
            ["model_name"], buckets=TTFT_BUCKETS_S, registry=self.registry)
        self._itl = Histogram(
            PREFIX + "inter_token_latency_seconds", "Time between consecutive token outputs.",
            ["model_name"], buckets=ITL_BUCKETS_S, registry=self.registry)
        self.registry.register(EngineStatsCollector(engine_stats, model_name))

    def record_finish(self, reason: str) -> None:
        """Count one answered request by its finish reason."""
        self._finished.labels(self._model, reason).inc()

    def record_error(self, status: int) -> None:
        self._errors.labels(self._model, str(status)).inc()

    def observe_ttft(self, seconds: float) -> None:
        self._ttft.labels(self._model).observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        self._itl.labels(self._model).observe(seconds)

    def render(self) -> bytes:
        """The text exposition of every metric (reads the engine's stats once)."""
        return generate_latest(self.registry)
