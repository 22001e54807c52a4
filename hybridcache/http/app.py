"""The aiohttp application: routes, API keys, error envelopes, and the operational endpoints.

`create_app(engine, frontend, options)` builds the app the server runs. Handlers never touch engine state:
they submit and await (`EngineProtocol.submit`, `.cancel`, `.stats`). Every refusal is an `ApiError`
rendered by `error_middleware` in the route's own envelope (Anthropic's for /v1/messages, OpenAI's
elsewhere); an unexpected exception becomes a 500 in that envelope and is logged, so a bad request
never takes the server down.

Routes: GET /v1/models, POST /v1/completions, POST /v1/chat/completions, POST /v1/messages,
POST /v1/chat/completions/render and /v1/completions/render (the prompt's token ids, for routers),
GET /server_info, GET /health, GET /metrics (Prometheus text, see metrics.py), GET /v1/cache/stats
(``engine.stats()`` as JSON; /metrics carries the same figures under the same names), GET
/v1/cache/integrity (``check_integrity()`` of the live index: 200 clean, 500 naming the first problem).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web

from hybridcache.core.api import EngineProtocol
from hybridcache.http.anthropic_routes import messages
from hybridcache.http.auth import authenticate
from hybridcache.http.errors import ApiError, error_response, kind_of_status, protocol_of_path
from hybridcache.http.metrics import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from hybridcache.http.openai_chat import chat_completions
from hybridcache.http.openai_completions import completions
from hybridcache.http.render_routes import chat_render, completion_render, server_info
from hybridcache.http.server_options import ServerOptions
from hybridcache.http.state import STATE_KEY, FrontendLike, ServerState, server_state
from hybridcache.http.waiting_cap import WaitingCap, waiting_cap_middleware
from hybridcache.logs import get_logger

log = get_logger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(engine: EngineProtocol, frontend: FrontendLike, options: ServerOptions) -> web.Application:
    """Build the application serving `engine` through `frontend`. Pure construction; nothing runs yet."""
    waiting = WaitingCap(options.max_concurrency, options.waiting_limit)
    app = web.Application(client_max_size=options.max_body_bytes,
                          middlewares=[error_middleware, waiting_cap_middleware(waiting)])
    app[STATE_KEY] = ServerState(engine, frontend, options)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/cache/stats", cache_stats)
    app.router.add_get("/v1/cache/integrity", cache_integrity)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/chat/completions/render", chat_render)
    app.router.add_post("/v1/completions/render", completion_render)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/get_server_info", server_info)
    return app


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate /v1/ routes (and /metrics when asked); render every refusal in the route's envelope;
    never let one escape."""
    state = server_state(request)
    protocol = protocol_of_path(request.path)
    try:
        if request.path.startswith("/v1/") or (
            request.path == "/metrics" and state.options.metrics_require_api_key
        ):
            authenticate(request, state.options.api_keys)
        return await handler(request)
    except ApiError as error:
        state.metrics.record_error(error.status)
        return error_response(error, protocol)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        state.metrics.record_error(error.status)
        return error_response(ApiError(error.status, error.reason, kind_of_status(error.status)), protocol)
    except ConnectionResetError:
        raise
    except Exception:
        log.exception("request %s %s failed", request.method, request.path)
        state.metrics.record_error(500)
        return error_response(ApiError(500, "Internal server error.", "internal"), protocol)


async def health(request: web.Request) -> web.Response:
    """200 while the engine serves; 503 once it reports that it is stopping.

    A failed event journal leaves the answer 200 with ``"status": "degraded"`` and the problem named:
    load balancers and Kubernetes probes (and vLLM's and SGLang's own /health contract) read any non-200
    as "take this replica out", but the server still serves every request correctly; the journal only
    records history. Monitoring sees the failure in the body and in
    ``hybridcache:journal_write_errors_total``. A cache directory that stopped making writes durable
    (``cache_dir_error``: disk full) degrades it the same way: the cache still serves from memory."""
    stats = server_state(request).engine.stats()
    if stats.get("stopping", False):
        return web.json_response({"status": "stopping"}, status=503)
    problems = [str(stats[key]) for key in ("journal_error", "cache_dir_error") if stats.get(key)]
    if problems:
        return web.json_response({"status": "degraded", "problems": problems})
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    state = server_state(request)
    card = {"id": state.served_model_name, "object": "model", "created": state.created_at,
            "owned_by": "hybridcache", "max_model_len": state.max_model_len}
    return web.json_response({"object": "list", "data": [card]})


async def metrics(request: web.Request) -> web.Response:
    body = server_state(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": PROMETHEUS_CONTENT_TYPE})


async def cache_stats(request: web.Request) -> web.Response:
    body = msgspec.json.encode(server_state(request).engine.stats(), enc_hook=str)
    return web.Response(body=body, content_type="application/json")


async def cache_integrity(request: web.Request) -> web.Response:
    """The index rebuilt and compared (O(index), on the event loop, so it sees a state between two
    events): the soak bench asks once its clients have stopped. Needs the API key like every /v1/ route."""
    try:
        server_state(request).engine.check_integrity()
    except AssertionError as problem:
        log.error("cache integrity check failed: %s", problem)
        return web.json_response({"clean": False, "problem": str(problem)}, status=500)
    return web.json_response({"clean": True})
