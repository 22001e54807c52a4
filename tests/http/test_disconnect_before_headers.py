"""A streaming client that leaves while its request is still queued (before the stream's headers are
sent) is a disconnect, not a server error: nothing is logged as a failed request, for every streaming
route. (The soak bench found the handlers failing there with UnboundLocalError.)"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import pytest

from tests.http.conftest import MODEL, LiveServer, StartServer
from tests.http.test_disconnect import wait_until

CHAT = [{"role": "user", "content": "Talk"}]
BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": CHAT, "stream": True},
    "/v1/completions": {"model": MODEL, "prompt": "Talk", "stream": True},
    "/v1/messages": {"model": MODEL, "max_tokens": 50, "messages": CHAT, "stream": True},
}


@pytest.fixture
async def live(start_server: StartServer) -> LiveServer:
    return await start_server(handler_cancellation=False)  # serve's default: handlers run on


@pytest.mark.parametrize("path", list(BODIES))
async def test_leaving_before_the_stream_opens_logs_no_failure(live: LiveServer, path: str, caplog):
    live.engine.admission_delay_s = 0.3
    caplog.set_level(logging.ERROR, logger="hybridcache")
    async with aiohttp.ClientSession() as session:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.post(live.root + path, json=BODIES[path]), 0.05)
    await wait_until(lambda: bool(live.engine.cancelled) and live.engine.running == 0)
    await asyncio.sleep(0.4)  # past the admission delay: the handler tried to open its stream
    assert [record.getMessage() for record in caplog.records] == []
