"""A client that goes away cancels its request: the engine hears `cancel` and the lane is released."""

from __future__ import annotations

import asyncio
import contextlib
import json

import aiohttp
import pytest

from tests.http.conftest import MODEL, LiveServer, StartServer

LONG_REPLY = "word " * 200


@pytest.fixture(params=[False, True], ids=["serve-default", "handler-cancellation"])
async def live(request: pytest.FixtureRequest, start_server: StartServer) -> LiveServer:
    """Both ways aiohttp can run the app: handlers left running after a disconnect, or cancelled."""
    return await start_server(handler_cancellation=request.param)


async def wait_until(condition, timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


async def test_closing_a_stream_mid_way_cancels_the_request(live: LiveServer):
    live.engine.reply = lambda prompt: LONG_REPLY
    live.engine.token_delay_s = 0.01
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        reply = await session.post(live.root + "/v1/chat/completions", json=body)
        frames = 0
        async for line in reply.content:
            frames += line.startswith(b"data: ")
            if frames == 5:
                break
        reply.close()  # drop the connection mid-stream
    await wait_until(lambda: live.engine.running == 0)
    submission = live.engine.last
    assert live.engine.cancelled == [submission.request_id]
    assert submission.outputs < len(live.engine.reply_ids(submission.prompt))


async def test_abandoning_an_anthropic_stream_cancels_too(live: LiveServer):
    live.engine.reply = lambda prompt: LONG_REPLY
    live.engine.token_delay_s = 0.01
    body = {"model": MODEL, "max_tokens": 500, "messages": [{"role": "user", "content": "Talk"}],
            "stream": True}
    async with aiohttp.ClientSession() as session:
        reply = await session.post(live.root + "/v1/messages", json=body)
        first = await reply.content.readline()
        assert first == b"event: message_start\n"
        reply.close()
    await wait_until(lambda: live.engine.running == 0)
    assert live.engine.cancelled == [live.engine.last.request_id]


async def test_a_client_that_gives_up_on_a_blocking_request_cancels_it(live: LiveServer):
    live.engine.reply = lambda prompt: LONG_REPLY
    live.engine.token_delay_s = 0.01
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk"}]}
    async with aiohttp.ClientSession() as session:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.post(live.root + "/v1/chat/completions", json=body), 0.2)
    await wait_until(lambda: live.engine.running == 0)
    assert live.engine.cancelled == [live.engine.last.request_id]


async def test_a_client_gone_while_queued_is_cancelled_before_any_token(live: LiveServer):
    live.engine.admission_delay_s = 0.4
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Talk"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session.post(live.root + "/v1/chat/completions", json=body), 0.1)
    await wait_until(lambda: bool(live.engine.cancelled))
    await wait_until(lambda: live.engine.running == 0)
    assert live.engine.last.outputs <= 2  # admission notice and the cancelled final, no tokens


async def test_a_finished_request_is_not_cancelled(live: LiveServer):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    async with aiohttp.ClientSession() as session, session.post(
            live.root + "/v1/chat/completions", json=body) as reply:
        text = await reply.text()
    assert text.endswith("data: [DONE]\n\n")
    first_chunk = json.loads(text.split("\n\n")[0].removeprefix("data: "))
    assert first_chunk["choices"][0]["delta"]["role"] == "assistant"
    assert live.engine.cancelled == []
    assert live.engine.running == 0
