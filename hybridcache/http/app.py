"""The aiohttp application: routes and error envelopes.

Handlers never touch engine state: they submit and await. Until the engine lands, every model endpoint
answers 503 with the OpenAI error envelope, and /health reports that the runtime is not ready.
"""

from __future__ import annotations

from aiohttp import web

MODEL_RUNTIME_MISSING = "model runtime not built yet"


def openai_error(status: int, message: str, error_type: str, code: str | None = None) -> web.Response:
    """An OpenAI-style error envelope: {"error": {"message", "type", "param", "code"}}."""
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return web.json_response(body, status=status)


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "unavailable", "reason": MODEL_RUNTIME_MISSING}, status=503)


async def _unavailable(request: web.Request) -> web.Response:
    return openai_error(503, MODEL_RUNTIME_MISSING, "service_unavailable", "model_not_ready")


def create_app(max_body_bytes: int) -> web.Application:
    """Build the application. Pure construction; nothing runs until the app is started."""
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/health", _health)
    for path in ("/v1/models",):
        app.router.add_get(path, _unavailable)
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/messages"):
        app.router.add_post(path, _unavailable)
    return app
