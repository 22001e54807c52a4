"""Every refusal comes back with its status in its protocol's own envelope, and the server keeps serving."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.http.conftest import MODEL, LiveServer, StartServer
from tests.http.fakes import PlannedFailure

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"
HELLO = [{"role": "user", "content": "Hi"}]
GOOD_CHAT = {"model": MODEL, "messages": HELLO, "max_tokens": 4}
GOOD_MESSAGE = {"model": MODEL, "messages": HELLO, "max_tokens": 4}


async def post(live: LiveServer, path: str, body: object, headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session, session.post(
            live.root + path, data=data,
            headers={"Content-Type": "application/json", **(headers or {})}) as reply:
        return reply.status, await reply.json(content_type=None)


def assert_openai_error(reply: tuple[int, dict], status: int, error_type: str, param: str | None = None,
                        fragment: str = "") -> None:
    code, body = reply
    assert code == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == error_type
    if param is not None:
        assert body["error"]["param"] == param
    assert fragment in body["error"]["message"]


def assert_anthropic_error(reply: tuple[int, dict], status: int, error_type: str, fragment: str = "") -> None:
    code, body = reply
    assert code == status, body
    assert body["type"] == "error"
    assert body["error"]["type"] == error_type
    assert fragment in body["error"]["message"]


OPENAI_BAD_CHATS = [
    pytest.param(b'{"model": "fake-model", "messages": [', 400, None, "Malformed JSON", id="malformed-json"),
    pytest.param({**GOOD_CHAT, "max_tokens": "four"}, 400, "max_tokens", "Expected `int | null`",
                 id="wrong-type"),
    pytest.param({**GOOD_CHAT, "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role",
                 "Invalid enum value", id="unknown-role"),
    pytest.param({"messages": HELLO}, 400, None, "missing required field `model`", id="missing-model"),
    pytest.param({**GOOD_CHAT, "messages": []}, 400, "messages", "at least one message", id="empty-messages"),
    pytest.param({**GOOD_CHAT, "max_tokens": 0}, 400, "max_tokens", ">= 1", id="zero-max-tokens"),
    pytest.param({**GOOD_CHAT, "max_tokens": 4000}, 400, "max_tokens", "maximum context length is 2048",
                 id="past-context"),
    pytest.param({**GOOD_CHAT, "messages": [{"role": "user", "content": "x" * 3000}], "max_tokens": None},
                 400,
                 "messages", "maximum context length", id="prompt-too-long"),
    pytest.param({**GOOD_CHAT, "temperature": -1}, 400, "temperature", "temperature: must be in",
                 id="temperature"),
    pytest.param({**GOOD_CHAT, "top_p": 0}, 400, "top_p", "top_p", id="top-p"),
    pytest.param({**GOOD_CHAT, "n": 2}, 400, "n", "only n=1", id="n-above-one"),
    pytest.param({**GOOD_CHAT, "top_logprobs": 3}, 400, "top_logprobs", "needs logprobs", id="top-logprobs"),
    pytest.param({**GOOD_CHAT, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400, "messages[0].content[0]",
        "only text content parts", id="image-part"),
    pytest.param({**GOOD_CHAT, "tool_choice": "required"}, 400, "tool_choice", "needs 'tools'",
                 id="choice-no-tools"),
    pytest.param({**GOOD_CHAT, "cache_salt": ""}, 400, "cache_salt", "non-empty", id="empty-salt"),
    pytest.param({**GOOD_CHAT, "logit_bias": {"abc": 5}}, 400, "logit_bias", "keys must be token ids",
                 id="logit-bias-key"),
    pytest.param({**GOOD_CHAT, "logit_bias": {"999999": 5}}, 400, "logit_bias", "keys must be token ids",
                 id="logit-bias-out-of-vocab"),
    pytest.param({**GOOD_CHAT, "logit_bias": {"5": 101}}, 400, "logit_bias", "logit_bias: must be in",
                 id="logit-bias-range"),
    pytest.param({**GOOD_CHAT, "response_format": {"type": "json_object"}}, 400, "response_format",
                 "'json_object' is not supported", id="json-mode"),
    pytest.param({**GOOD_CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400,
                 "response_format", "'json_schema' is not supported", id="json-schema"),
    pytest.param({**GOOD_CHAT, "response_format": {"json_schema": {}}}, 400, "response_format",
                 "missing required field `type`", id="format-without-type"),
]


@pytest.mark.parametrize(("body", "status", "param", "fragment"), OPENAI_BAD_CHATS)
async def test_bad_chat_requests_get_400_in_openai_envelope(live: LiveServer, body, status, param, fragment):
    assert_openai_error(await post(live, CHAT, body), status, "invalid_request_error", param, fragment)
    assert live.engine.submissions == []


async def test_unknown_model_is_404_and_names_the_served_model(live: LiveServer):
    status, body = await post(live, CHAT, {**GOOD_CHAT, "model": "gpt-9"})
    assert_openai_error((status, body), 404, "invalid_request_error", "model", "does not exist")
    assert body["error"]["code"] == "model_not_found"
    assert f"this server serves `{MODEL}`" in body["error"]["message"]
    assert_anthropic_error(await post(live, MESSAGES, {**GOOD_MESSAGE, "model": "claude-9"}), 404,
                           "not_found_error")


@pytest.mark.parametrize(("body", "fragment"), [
    ({"model": MODEL, "prompt": [], "max_tokens": 2}, "must not be empty"),
    ({"model": MODEL, "prompt": [1, 2, 999999], "max_tokens": 2}, "token ids must be integers"),
    ({"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2}, "one prompt per request"),
    ({"model": MODEL, "prompt": "a", "suffix": "z"}, "suffix"),
    ({"model": MODEL, "prompt": "a", "best_of": 3}, "best_of"),
    ({"model": MODEL, "prompt": "a", "logit_bias": {"-3": 1}}, "logit_bias: keys must be token ids"),
    ({"model": MODEL, "prompt": "a", "response_format": {"type": "json_object"}}, "response_format"),
])
async def test_bad_completion_requests_get_400(live: LiveServer, body, fragment):
    assert_openai_error(await post(live, COMPLETIONS, body), 400, "invalid_request_error", fragment=fragment)


@pytest.mark.parametrize(("body", "fragment"), [
    (b"not json", "Malformed JSON"),
    ({"model": MODEL, "messages": HELLO}, "missing required field `max_tokens`"),
    ({**GOOD_MESSAGE, "messages": []}, "at least one message"),
    ({**GOOD_MESSAGE, "max_tokens": -1}, ">= 1"),
    ({**GOOD_MESSAGE, "temperature": 1.5}, "temperature"),
    ({**GOOD_MESSAGE, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "Invalid value 'image'"),
    ({**GOOD_MESSAGE, "max_tokens": 5000}, "maximum context length"),
])
async def test_bad_messages_get_400_in_anthropic_envelope(live: LiveServer, body, fragment):
    assert_anthropic_error(await post(live, MESSAGES, body), 400, "invalid_request_error", fragment)


async def test_a_body_over_the_limit_is_413(start_server: StartServer):
    live = await start_server(max_body_bytes=2048)
    huge = {**GOOD_CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
    assert_openai_error(await post(live, CHAT, huge), 413, "invalid_request_error")
    assert_anthropic_error(await post(live, MESSAGES, {**GOOD_MESSAGE, **huge}), 413, "request_too_large")


async def test_an_unknown_route_is_404_in_the_envelope(live: LiveServer):
    assert_openai_error(await post(live, "/v1/embeddings", {"input": "x"}), 404, "invalid_request_error")


@pytest.mark.parametrize(("kind", "status", "openai_type", "anthropic_type"), [
    ("unavailable", 503, "service_unavailable_error", "overloaded_error"),
    ("timeout", 408, "timeout_error", "timeout_error"),
    ("too_long", 400, "invalid_request_error", "invalid_request_error"),
    ("internal", 500, "server_error", "api_error"),
])
async def test_engine_refusals_map_to_statuses(live: LiveServer, kind, status, openai_type, anthropic_type):
    live.engine.failure = PlannedFailure(kind, f"engine says {kind}")
    assert_openai_error(await post(live, CHAT, GOOD_CHAT), status, openai_type,
                        fragment=f"engine says {kind}")
    assert_anthropic_error(await post(live, MESSAGES, GOOD_MESSAGE), status, anthropic_type)


async def test_an_engine_failure_mid_stream_ends_the_stream_with_an_error_frame(live: LiveServer):
    live.engine.failure = PlannedFailure("unavailable", "stopping", after_tokens=3)
    async with aiohttp.ClientSession() as session, session.post(
            live.root + CHAT, json={**GOOD_CHAT, "stream": True}) as reply:
        assert reply.status == 200
        frames = [line for line in (await reply.text()).split("\n\n") if line]
    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2].removeprefix("data: "))["error"]["type"] == "service_unavailable_error"


async def test_an_unexpected_crash_is_a_500_and_the_server_survives(live: LiveServer):
    def explode(prompt_text: str) -> str:
        raise RuntimeError("boom")

    live.engine.reply = explode
    assert_openai_error(await post(live, CHAT, GOOD_CHAT), 500, "server_error",
                        fragment="Internal server error")
    live.engine.reply = lambda prompt_text: "ok</think>fine"
    status, body = await post(live, CHAT, {**GOOD_CHAT, "max_tokens": 64})
    assert status == 200 and body["choices"][0]["message"]["content"] == "fine"


async def test_after_a_burst_of_bad_requests_a_good_one_is_served(live: LiveServer):
    for param in OPENAI_BAD_CHATS:
        body, status = param.values[0], param.values[1]
        assert (await post(live, CHAT, body))[0] == status
    reply = await live.openai().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=64)
    assert reply.choices[0].finish_reason == "stop"
    assert live.engine.running == 0


async def test_an_engine_refusal_is_not_cancelled_back(live: LiveServer):
    live.engine.failure = PlannedFailure("unavailable", "stopping")
    assert (await post(live, CHAT, GOOD_CHAT))[0] == 503
    assert live.engine.cancelled == []
    assert live.engine.running == 0
