"""Server-sent events: open a stream, send ``data:`` frames (OpenAI) or named events (Anthropic).

Writing to a client that has gone raises `ConnectionResetError` (aiohttp's own error subclasses it); the
handlers treat that as a disconnect. Functions here only write to the response they are given.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

DONE_FRAME = b"data: [DONE]\n\n"
CLIENT_CLOSED_REQUEST = 499


async def open_event_stream(request: web.Request) -> web.StreamResponse:
    """Send the headers of an SSE response and return it. Raises ConnectionResetError if the client left."""
    response = web.StreamResponse(status=200, headers={
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
    })
    await response.prepare(request)
    return response


def client_gone() -> web.Response:
    """What a handler returns when its client left before the stream's headers went out: aiohttp's
    attempt to send it fails quietly as a disconnect, and the access log shows 499 (nginx's "client
    closed request"). Raising instead would be logged as an error, with a traceback."""
    return web.Response(status=CLIENT_CLOSED_REQUEST)


async def send_data(response: web.StreamResponse, payload: object) -> None:
    """One ``data: <json>`` frame. Raises ConnectionResetError if the client left."""
    await response.write(b"data: " + msgspec.json.encode(payload) + b"\n\n")


async def send_event(response: web.StreamResponse, event: str, payload: object) -> None:
    """One ``event: <name>`` frame with a JSON ``data`` line.

    Raises ConnectionResetError if the client left."""
    await response.write(b"event: " + event.encode() + b"\ndata: " + msgspec.json.encode(payload) + b"\n\n")


async def send_done(response: web.StreamResponse) -> None:
    """OpenAI's terminator, ``data: [DONE]``, then the end of the body."""
    await response.write(DONE_FRAME)
    await response.write_eof()
