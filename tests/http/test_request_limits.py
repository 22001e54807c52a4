"""One request cannot ask for unbounded work: limits on stop strings, tools, messages and top_logprobs are
clear 400s, and requests beyond the waiting cap get 429 with Retry-After."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest

from hybridcache.http.request_limits import (
    MAX_MESSAGES,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOOLS,
)
from tests.http.conftest import MODEL, LiveServer, StartServer
from tests.http.test_errors import (
    CHAT,
    COMPLETIONS,
    GOOD_CHAT,
    GOOD_MESSAGE,
    MESSAGES,
    assert_anthropic_error,
    assert_openai_error,
    post,
)

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
ANTHROPIC_TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {}}}
GOOD_COMPLETION = {"model": MODEL, "prompt": "Hello", "max_tokens": 4}
MANY_MESSAGES = [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)

OPENAI_OVER_LIMIT = [
    pytest.param(CHAT, {**GOOD_CHAT, "stop": ["s"] * (MAX_STOP_STRINGS + 1)}, "stop",
                 f"at most {MAX_STOP_STRINGS} stop strings", id="chat-stop-count"),
    pytest.param(CHAT, {**GOOD_CHAT, "stop": ["ok", "s" * (MAX_STOP_STRING_CHARS + 1)]}, "stop",
                 f"stop[1]: a stop string has at most {MAX_STOP_STRING_CHARS}", id="chat-stop-length"),
    pytest.param(CHAT, {**GOOD_CHAT, "stop": "s" * (MAX_STOP_STRING_CHARS + 1)}, "stop",
                 "at most", id="chat-single-stop-length"),
    pytest.param(COMPLETIONS, {**GOOD_COMPLETION, "stop": ["s"] * (MAX_STOP_STRINGS + 1)}, "stop",
                 "stop strings", id="completion-stop-count"),
    pytest.param(CHAT, {**GOOD_CHAT, "tools": [TOOL] * (MAX_TOOLS + 1)}, "tools",
                 f"at most {MAX_TOOLS} tools", id="chat-tools"),
    pytest.param(CHAT, {**GOOD_CHAT, "messages": MANY_MESSAGES}, "messages",
                 f"at most {MAX_MESSAGES} messages", id="chat-messages"),
    pytest.param(CHAT, {**GOOD_CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs",
                 "top_logprobs", id="chat-top-logprobs-high"),
    pytest.param(CHAT, {**GOOD_CHAT, "logprobs": True, "top_logprobs": -1}, "top_logprobs",
                 "top_logprobs", id="chat-top-logprobs-negative"),
    pytest.param(COMPLETIONS, {**GOOD_COMPLETION, "logprobs": 21}, "logprobs", "logprobs",
                 id="completion-logprobs-high"),
]


@pytest.mark.parametrize(("path", "body", "param", "fragment"), OPENAI_OVER_LIMIT)
async def test_requests_over_a_limit_get_400_naming_the_field(live: LiveServer, path, body, param, fragment):
    assert_openai_error(await post(live, path, body), 400, "invalid_request_error", param, fragment)
    assert live.engine.submissions == []


@pytest.mark.parametrize(("body", "fragment"), [
    pytest.param({**GOOD_MESSAGE, "stop_sequences": ["s"] * (MAX_STOP_STRINGS + 1)},
                 "stop_sequences: at most", id="stop-count"),
    pytest.param({**GOOD_MESSAGE, "stop_sequences": ["s" * (MAX_STOP_STRING_CHARS + 1)]},
                 "stop_sequences[0]", id="stop-length"),
    pytest.param({**GOOD_MESSAGE, "tools": [ANTHROPIC_TOOL] * (MAX_TOOLS + 1)}, "tools: at most", id="tools"),
    pytest.param({**GOOD_MESSAGE, "messages": MANY_MESSAGES}, "messages: at most", id="messages"),
])
async def test_messages_over_a_limit_get_400_in_anthropic_envelope(live: LiveServer, body, fragment):
    assert_anthropic_error(await post(live, MESSAGES, body), 400, "invalid_request_error", fragment)
    assert live.engine.submissions == []


async def test_requests_at_the_limits_are_served(live: LiveServer):
    at_limit = {**GOOD_CHAT, "stop": ["s" * MAX_STOP_STRING_CHARS] + ["zz"] * (MAX_STOP_STRINGS - 1),
                "tools": [TOOL] * 3, "logprobs": True, "top_logprobs": 20}
    status, body = await post(live, CHAT, at_limit)
    assert status == 200, body
    assert len(live.engine.submissions) == 1


async def test_requests_beyond_the_waiting_cap_get_429_with_retry_after(start_server: StartServer):
    server = await start_server(max_concurrency=1, max_waiting=2)
    server.engine.token_delay_s = 0.05  # each request stays in flight for a while
    slow = [asyncio.create_task(post(server, CHAT, {**GOOD_CHAT, "max_tokens": 8})) for _ in range(3)]
    while len(server.engine.submissions) < 3:
        await asyncio.sleep(0.01)

    async with aiohttp.ClientSession() as session, session.post(server.root + CHAT, json=GOOD_CHAT) as reply:
        status, retry_after, body = reply.status, reply.headers.get("Retry-After"), await reply.json()
    assert status == 429 and retry_after is not None and int(retry_after) >= 1
    assert body["error"]["code"] == "rate_limit_exceeded" and "waiting" in body["error"]["message"]
    status, body = await post(server, MESSAGES, GOOD_MESSAGE)
    assert status == 429 and body["error"]["type"] == "rate_limit_error"
    with pytest.raises(openai.RateLimitError):
        await server.openai().chat.completions.create(model=MODEL, messages=GOOD_CHAT["messages"])
    assert len(server.engine.submissions) == 3  # refused requests never reached the engine

    assert [status for status, _ in await asyncio.gather(*slow)] == [200, 200, 200]
    status, _ = await post(server, CHAT, GOOD_CHAT)  # the queue drained: served again
    assert status == 200


async def test_the_default_cap_scales_with_the_lanes():
    from hybridcache.http.server_options import WAITING_PER_LANE, ServerOptions

    assert ServerOptions(max_concurrency=3).waiting_limit == 3 * WAITING_PER_LANE
    assert ServerOptions(max_concurrency=3, max_waiting=0).waiting_limit == 0
