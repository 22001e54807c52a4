"""Which replica answered: every response carries ``x-hybridcache-replica`` (`serve --replica-id`).

Behind a router, a client (`bench trace`) reads it to tell a request sent away from its prefix from one
whose prefix was evicted; routers pass response headers through. /server_info names it too.
"""

from __future__ import annotations

from aiohttp import web

from hybridcache.http.state import server_state

REPLICA_HEADER = "x-hybridcache-replica"


async def name_the_replica(request: web.Request, response: web.StreamResponse) -> None:
    """An `on_response_prepare` hook: it runs as each response's headers go out, streamed ones and
    errors included (a middleware would be too late for a stream)."""
    response.headers[REPLICA_HEADER] = replica_name(request)


def replica_name(request: web.Request) -> str:
    """This server's `--replica-id`, else the address `request` reached it on (the port it was given
    when it asked for port 0)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return server_state(request).options.replica_name(sockname[1] if sockname else None)
