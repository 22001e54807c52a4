"""What every handler needs: the engine, the frontend, the options and the metrics, kept on the app.

`FrontendLike` is the surface of `core.frontend.Frontend` the handlers call (so tests can pass a stand-in).
`ServerState` is built once by `create_app`; handlers read it through `server_state(request)`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from aiohttp import web

from hybridcache.core.api import EngineProtocol, PreparedPrompt
from hybridcache.core.tokenizer import Tokenizer
from hybridcache.http.errors import ApiError
from hybridcache.http.metrics import ServerMetrics
from hybridcache.http.server_options import ServerOptions


class FrontendLike(Protocol):
    """Tokenize and template requests into `PreparedPrompt`s (raises FrontendError on bad input)."""

    tokenizer: Tokenizer
    max_model_len: int

    def prepare_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None, *,
                     add_generation_prompt: bool = True, template_kwargs: dict[str, Any] | None = None,
                     cache_salt: str | None = None, breakpoints: Sequence[int] = (),
                     prefix_reuse: bool = True) -> PreparedPrompt: ...

    def prepare_tokens(self, token_ids: Sequence[int], cache_salt: str | None = None,
                       prefix_reuse: bool = True) -> PreparedPrompt: ...

    def prepare_text(self, text: str, cache_salt: str | None = None,
                     prefix_reuse: bool = True) -> PreparedPrompt: ...


class ServerState:
    """The app's shared objects. Handlers mutate only `metrics`; the engine is only submitted to."""

    def __init__(self, engine: EngineProtocol, frontend: FrontendLike, options: ServerOptions) -> None:
        self.engine = engine
        self.frontend = frontend
        self.options = options
        self.served_model_name = options.served_model_name or engine.model_name
        self.metrics = ServerMetrics(engine.stats, self.served_model_name)
        self.created_at = int(time.time())

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def check_model(self, model: str) -> None:
        """Raises ApiError 404 unless `model` is the served name (or the engine's own name)."""
        if model not in (self.served_model_name, self.engine.model_name):
            raise ApiError(404, f"The model `{model}` does not exist; this server serves "
                           f"`{self.served_model_name}`.", "not_found", "model", "model_not_found")


STATE_KEY = web.AppKey("hybridcache_server_state", ServerState)


def server_state(request: web.Request) -> ServerState:
    """The `ServerState` of the app serving `request`."""
    return request.app[STATE_KEY]
