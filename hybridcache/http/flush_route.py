"""POST /flush_cache: empty this replica's prefix cache, as SGLang's and vLLM's routers ask their workers.

Everything cached that no running request holds is deleted through the cache's own events (so the
journal, the cache directory and the KV-event publisher follow), and a router subscribed to
`--kv-events` then gets ``AllBlocksCleared`` followed by what is left. Safe while requests run: a
running request keeps the path it is using, finishes normally, and what it publishes afterwards is
cached as usual; the answer says how many cached subtrees went (``flushed_subtrees``) and how many
requests were running. Needs the API key when the server has one (it destroys work). A stopping engine
answers 503.
"""

from __future__ import annotations

from aiohttp import web

from hybridcache.core.api import RequestError
from hybridcache.http.errors import from_engine_error
from hybridcache.http.state import server_state

FLUSH_PATH = "/flush_cache"


async def flush_cache(request: web.Request) -> web.Response:
    engine = server_state(request).engine
    running = int(engine.stats().get("requests_running", 0) or 0)  # type: ignore[call-overload]
    try:
        flushed = await engine.flush_cache()
    except RequestError as error:
        raise from_engine_error(error) from None
    return web.json_response({"message": "Cache flushed.", "flushed_subtrees": flushed,
                              "requests_running": running})
