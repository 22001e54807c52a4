"""The cap on requests waiting for a lane (`--max-waiting`): beyond it a request gets 429 + Retry-After.

Counted at the HTTP edge, on the event loop, so the count is exact and needs no engine state: a
generation request is in flight from the moment its handler starts until its response ends; those
beyond the engine's lanes (`max_concurrency`) are waiting. A refused request never reaches the engine.
"""

from __future__ import annotations

from aiohttp import web

from hybridcache.http.errors import ApiError

GENERATION_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/messages"})
RETRY_AFTER_S = 2  # long enough for a few decode rounds to finish requests, short enough to keep clients busy


class WaitingCap:
    """Counts generation requests in flight; `enter()` refuses one beyond `lanes + max_waiting`.

    Mutates only itself; used from the event loop only."""

    def __init__(self, lanes: int, max_waiting: int) -> None:
        self.limit = lanes + max_waiting
        self.max_waiting = max_waiting
        self.in_flight = 0
        self.refused = 0

    def enter(self) -> None:
        """Count one more request in flight. Raises ApiError 429 (with Retry-After) when the queue is full."""
        if self.in_flight >= self.limit:
            self.refused += 1
            raise ApiError(429, f"Too many requests waiting ({self.max_waiting} already queued for a lane); "
                           f"retry after {RETRY_AFTER_S} s.", "rate_limited", code="rate_limit_exceeded",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1


def waiting_cap_middleware(cap: WaitingCap):
    """An aiohttp middleware that holds generation POSTs to `cap` (inside the error middleware, so a 429
    is rendered in the route's envelope and counted)."""

    @web.middleware
    async def middleware(request: web.Request, handler) -> web.StreamResponse:
        if request.method != "POST" or request.path not in GENERATION_ROUTES:
            return await handler(request)
        cap.enter()
        try:
            return await handler(request)
        finally:
            cap.leave()

    return middleware
