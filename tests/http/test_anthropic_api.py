"""The Anthropic Messages endpoint, driven by the official `anthropic` client against a live app."""

from __future__ import annotations

import anthropic
import pytest

from hybridcache.cache.tap_planner import HintKind
from tests.http.conftest import MODEL, LiveServer
from tests.http.fakes import DEFAULT_ANSWER, DEFAULT_REASONING

HELLO = [{"role": "user", "content": "Hi there, how are you today?"}]
WEATHER_TOOL = {"name": "get_weather", "description": "Current weather in a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
WEATHER_CALL_REPLY = ('Look it up.\n</think>\n\nChecking.\n<tool_call>\n{"name": "get_weather", '
                      '"arguments": {"city": "Paris"}}\n</tool_call>')
EPHEMERAL = {"type": "ephemeral"}


def long_system() -> str:
    return "You are a careful assistant who answers in full sentences. " * 10


def explicit_hints(live: LiveServer) -> list[int]:
    hints = live.engine.last.prompt.tap_hints
    return [position for position, kind in hints if kind == int(HintKind.EXPLICIT)]


async def test_message_has_thinking_then_text_and_usage(live: LiveServer):
    message = await live.anthropic().messages.create(model=MODEL, max_tokens=256, messages=HELLO)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == DEFAULT_REASONING
    assert message.content[1].text == DEFAULT_ANSWER
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens == live.engine.last.prompt.num_tokens
    assert message.usage.cache_read_input_tokens == 0


async def test_thinking_disabled_gives_only_text(live: LiveServer):
    message = await live.anthropic().messages.create(model=MODEL, max_tokens=256, messages=HELLO,
                                                     thinking={"type": "disabled"})
    assert [block.type for block in message.content] == ["text"]
    assert live.frontend.last_call["template_kwargs"] == {"enable_thinking": False}


async def test_stream_follows_the_event_sequence_and_reassembles(live: LiveServer):
    async with live.anthropic().messages.stream(model=MODEL, max_tokens=256, messages=HELLO) as stream:
        events = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert events[0] == "message_start"
    assert events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events and "message_delta" in events
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[1].text == DEFAULT_ANSWER
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len(live.engine.reply_ids(live.engine.last.prompt))


async def test_cache_read_is_known_at_message_start(live: LiveServer):
    live.engine.reuse_override = 64
    async with live.anthropic().messages.stream(model=MODEL, max_tokens=8, messages=HELLO) as stream:
        async for event in stream:
            if event.type == "message_start":
                usage = event.message.usage
                break
    assert usage.cache_read_input_tokens == 64
    assert usage.input_tokens == live.engine.last.prompt.num_tokens - 64


async def test_tool_use_round_trip(live: LiveServer):
    live.engine.reply = lambda prompt: WEATHER_CALL_REPLY
    client = live.anthropic()
    first = await client.messages.create(model=MODEL, max_tokens=256, messages=HELLO, tools=[WEATHER_TOOL])
    assert first.stop_reason == "tool_use"
    tool_use = first.content[-1]
    assert (tool_use.type, tool_use.name, tool_use.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert first.content[-2].text == "Checking."

    live.engine.reply = lambda prompt: "ok\n</think>\n\nSunny in Paris."
    follow_up = [*HELLO, {"role": "assistant", "content": [block.model_dump() for block in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id,
                                               "content": "sunny"}]}]
    second = await client.messages.create(model=MODEL, max_tokens=256, messages=follow_up,
                                          tools=[WEATHER_TOOL])
    assert second.content[-1].text == "Sunny in Paris."
    sent = live.frontend.last_call["messages"]
    assert [message["role"] for message in sent] == ["user", "assistant", "tool"]
    assert sent[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert sent[1]["reasoning_content"] == "Look it up."


async def test_streamed_tool_use_is_accumulated_by_the_client(live: LiveServer):
    live.engine.reply = lambda prompt: WEATHER_CALL_REPLY
    async with live.anthropic().messages.stream(model=MODEL, max_tokens=256, messages=HELLO,
                                                tools=[WEATHER_TOOL]) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert final.content[-1].input == {"city": "Paris"}


async def test_second_turn_reads_from_the_cache(live: LiveServer):
    client = live.anthropic()
    turn = [{"role": "user", "content": "First question about the weather in Paris?"}]
    await client.messages.create(model=MODEL, max_tokens=4, system=long_system(), messages=turn)
    second = [*turn, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And tomorrow?"}]
    message = await client.messages.create(model=MODEL, max_tokens=4, system=long_system(), messages=second)
    assert message.usage.cache_read_input_tokens > 0
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == \
        live.engine.last.prompt.num_tokens


async def test_cache_control_becomes_explicit_tap_hints(live: LiveServer):
    system = [{"type": "text", "text": long_system(), "cache_control": EPHEMERAL}]
    question = {"type": "text", "text": "Question?", "cache_control": EPHEMERAL}
    messages = [{"role": "user", "content": [question]},
                {"role": "assistant", "content": "Answer."},
                {"role": "user", "content": "Follow-up?"}]
    await live.anthropic().messages.create(model=MODEL, max_tokens=4, system=system, messages=messages)
    assert live.frontend.last_call["breakpoints"] == (0, 1)
    assert len(explicit_hints(live)) == 2


@pytest.mark.parametrize(("mutation", "fragment"), [
    ("five_markers", "A maximum of 4 blocks with cache_control"),
    ("bad_type", "Input should be 'ephemeral'"),
    ("long_after_short", "ttl='1h' must not come after"),
    ("empty_text", "cannot be set for empty text blocks"),
])
async def test_invalid_cache_control_is_refused_like_anthropic(live: LiveServer, mutation: str,
                                                                fragment: str):
    blocks = [{"type": "text", "text": f"part {index}", "cache_control": EPHEMERAL} for index in range(4)]
    if mutation == "five_markers":
        blocks.append({"type": "text", "text": "part 5", "cache_control": EPHEMERAL})
    elif mutation == "bad_type":
        blocks[0]["cache_control"] = {"type": "persistent"}
    elif mutation == "long_after_short":
        blocks[1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    else:
        blocks[0]["text"] = ""
    with pytest.raises(anthropic.BadRequestError) as caught:
        await live.anthropic().messages.create(model=MODEL, max_tokens=4,
                                               messages=[{"role": "user", "content": blocks}])
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert fragment in caught.value.body["error"]["message"]
    assert live.engine.submissions == []


async def test_stop_sequences_end_the_message(live: LiveServer):
    message = await live.anthropic().messages.create(model=MODEL, max_tokens=256, messages=HELLO,
                                                     stop_sequences=["engine"])
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == "engine"
    assert message.content[-1].text == "Hello from the fake "


async def test_max_tokens_stop_reason(live: LiveServer):
    message = await live.anthropic().messages.create(model=MODEL, max_tokens=2, messages=HELLO)
    assert message.stop_reason == "max_tokens"
    assert message.usage.output_tokens == 2


async def test_cache_salt_reaches_the_frontend(live: LiveServer):
    await live.anthropic().messages.create(model=MODEL, max_tokens=2, messages=HELLO,
                                           extra_body={"cache_salt": "team-7"})
    assert live.frontend.last_call["cache_salt"] == "team-7"
