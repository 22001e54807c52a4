"""The OpenAI endpoints, driven by the official `openai` client against a live app on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json

import pytest

from hybridcache.http.server_options import DEFAULT_MAX_TOKENS
from tests.http.conftest import MODEL, LiveServer
from tests.http.fakes import DEFAULT_ANSWER, DEFAULT_REASONING

HELLO = [{"role": "user", "content": "Hi there, how are you today?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}},
}
WEATHER_CALL_REPLY = ('I should look it up.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
                      '"arguments": {"city": "Paris"}}\n</tool_call>')


def long_conversation(turns: int = 6) -> list[dict]:
    """A conversation long enough to span several 64-token blocks."""
    messages: list[dict] = [{"role": "system", "content": "You are a careful assistant. " * 8}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question number {turn}: tell me something new."})
        messages.append({"role": "assistant", "content": f"Answer number {turn}: here is something."})
    messages.append({"role": "user", "content": "And one more thing?"})
    return messages


async def test_chat_returns_reasoning_and_answer_with_usage(live: LiveServer):
    reply = await live.openai().chat.completions.create(model=MODEL, messages=HELLO)
    message = reply.choices[0].message
    assert message.content == DEFAULT_ANSWER
    assert message.reasoning_content == DEFAULT_REASONING
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.prompt_tokens == live.engine.last.prompt.num_tokens
    assert reply.usage.completion_tokens == len(live.engine.reply_ids(live.engine.last.prompt))
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


async def test_chat_with_thinking_disabled_has_no_reasoning(live: LiveServer):
    reply = await live.openai().chat.completions.create(
        model=MODEL, messages=HELLO, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].message.content == DEFAULT_ANSWER
    assert getattr(reply.choices[0].message, "reasoning_content", None) is None
    assert live.frontend.last_call["template_kwargs"] == {"enable_thinking": False}


async def test_streamed_chat_reassembles_to_the_same_answer(live: LiveServer):
    stream = await live.openai().chat.completions.create(
        model=MODEL, messages=HELLO, stream=True, stream_options={"include_usage": True})
    content, reasoning, finish, usage = [], [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            finish = choice.finish_reason or finish
    assert "".join(content) == DEFAULT_ANSWER
    assert "".join(reasoning) == DEFAULT_REASONING
    assert finish == "stop"
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_system_developer_and_tool_roles_reach_the_template(live: LiveServer):
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather "},
                                     {"type": "text", "text": "in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    await live.openai().chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])
    sent = live.frontend.last_call["messages"]
    assert [message["role"] for message in sent] == ["system", "user", "assistant", "tool"]
    assert sent[1]["content"] == "Weather in Paris?"
    prompt_text = live.frontend.tokenizer.decode(live.engine.last.prompt.token_ids)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt_text
    assert '"name": "get_weather"' in prompt_text


async def test_tool_call_round_trip(live: LiveServer):
    live.engine.reply = lambda prompt: WEATHER_CALL_REPLY
    client = live.openai()
    first = await client.chat.completions.create(model=MODEL, messages=HELLO, tools=[WEATHER_TOOL])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}

    live.engine.reply = lambda prompt: "done\n</think>\n\nIt is sunny in Paris."
    follow_up = [*HELLO, choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = await client.chat.completions.create(model=MODEL, messages=follow_up, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "It is sunny in Paris."
    prompt_text = live.frontend.tokenizer.decode(live.engine.last.prompt.token_ids)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt_text


async def test_streamed_tool_call_arrives_whole(live: LiveServer):
    live.engine.reply = lambda prompt: WEATHER_CALL_REPLY
    stream = await live.openai().chat.completions.create(model=MODEL, messages=HELLO, tools=[WEATHER_TOOL],
                                                         stream=True)
    calls, finish = [], None
    async for chunk in stream:
        for choice in chunk.choices:
            calls.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [(call.index, call.function.name) for call in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}


async def test_tool_choice_none_renders_no_tools_and_parses_no_calls(live: LiveServer):
    live.engine.reply = lambda prompt: WEATHER_CALL_REPLY
    reply = await live.openai().chat.completions.create(model=MODEL, messages=HELLO, tools=[WEATHER_TOOL],
                                                        tool_choice="none")
    assert live.frontend.last_call["tools"] is None
    assert not reply.choices[0].message.tool_calls
    assert "<tool_call>" in reply.choices[0].message.content


async def test_named_tool_choice_renders_only_that_tool(live: LiveServer):
    other = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    await live.openai().chat.completions.create(
        model=MODEL, messages=HELLO, tools=[WEATHER_TOOL, other],
        tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert [tool["function"]["name"] for tool in live.frontend.last_call["tools"]] == ["get_time"]


async def test_second_turn_reports_cached_tokens_from_accounting(live: LiveServer):
    client = live.openai()
    first = await client.chat.completions.create(model=MODEL, messages=long_conversation(), max_tokens=4)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    second_turn = [*long_conversation(), {"role": "assistant", "content": "ok"},
                   {"role": "user", "content": "Next?"}]
    second = await client.chat.completions.create(model=MODEL, messages=second_turn, max_tokens=4)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0


async def test_cached_tokens_is_exactly_the_engines_reuse_tokens(live: LiveServer):
    live.engine.reuse_override = 17
    reply = await live.openai().chat.completions.create(model=MODEL, messages=HELLO)
    assert reply.usage.prompt_tokens_details.cached_tokens == 17


async def test_two_cache_salts_never_share_reuse(live: LiveServer):
    client = live.openai()
    await client.chat.completions.create(model=MODEL, messages=long_conversation(), max_tokens=2,
                                         extra_body={"cache_salt": "tenant-a"})
    assert live.frontend.last_call["cache_salt"] == "tenant-a"
    other = await client.chat.completions.create(model=MODEL, messages=long_conversation(), max_tokens=2,
                                                 extra_body={"cache_salt": "tenant-b"})
    same = await client.chat.completions.create(model=MODEL, messages=long_conversation(), max_tokens=2,
                                                extra_body={"cache_salt": "tenant-a"})
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert same.usage.prompt_tokens_details.cached_tokens > 0


async def test_sampling_fields_reach_the_engine(live: LiveServer):
    await live.openai().chat.completions.create(
        model=MODEL, messages=HELLO, max_completion_tokens=7, temperature=0.5, top_p=0.9, seed=3,
        presence_penalty=0.5, frequency_penalty=0.25, user="u-1", prompt_cache_key="conv-1",
        logit_bias={"7": -100, "11": 2.5},
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "stop_token_ids": [5]})
    sampling = live.engine.last.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.seed) == (7, 0.5, 0.9, 3)
    assert (sampling.top_k, sampling.min_p, sampling.repetition_penalty) == (20, 0.05, 1.1)
    assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, 0.25)
    assert sampling.stop_token_ids == (5,)
    assert sampling.logit_bias == ((7, -100.0), (11, 2.5))


async def test_a_plain_text_response_format_is_accepted(live: LiveServer):
    reply = await live.openai().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2,
                                                        response_format={"type": "text"})
    assert reply.object == "chat.completion" and reply.choices[0].finish_reason is not None
    assert live.engine.last.sampling.max_tokens == 2


async def test_max_tokens_defaults_to_the_documented_cap(live: LiveServer):
    await live.openai().chat.completions.create(model=MODEL, messages=HELLO)
    assert live.engine.last.sampling.max_tokens == DEFAULT_MAX_TOKENS


async def test_the_default_cap_is_a_server_option_and_never_passes_the_context(start_server):
    small = await start_server(default_max_tokens=5)
    await small.openai().chat.completions.create(model=MODEL, messages=HELLO)
    assert small.engine.last.sampling.max_tokens == 5
    large = await start_server(default_max_tokens=10**6)
    await large.openai().chat.completions.create(model=MODEL, messages=HELLO)
    submission = large.engine.last
    assert submission.sampling.max_tokens == large.engine.max_model_len - submission.prompt.num_tokens


async def test_length_finish_when_max_tokens_runs_out(live: LiveServer):
    reply = await live.openai().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_string_trims_the_text_and_cancels_the_engine_request(live: LiveServer, stream: bool):
    client = live.openai()
    request = {"model": MODEL, "messages": HELLO, "stop": ["fake"]}
    if stream:
        chunks = [chunk async for chunk in await client.chat.completions.create(**request, stream=True)]
        text = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
        choices = [choice for chunk in chunks for choice in chunk.choices]
        finish = [choice.finish_reason for choice in choices if choice.finish_reason]
    else:
        reply = await client.chat.completions.create(**request)
        text, finish = reply.choices[0].message.content, [reply.choices[0].finish_reason]
    assert text == "Hello from the "
    assert finish == ["stop"]
    assert live.engine.cancelled == [live.engine.last.request_id]


async def test_chat_logprobs_carry_tokens_and_alternatives(live: LiveServer):
    reply = await live.openai().chat.completions.create(model=MODEL, messages=HELLO, logprobs=True,
                                                        top_logprobs=2, max_tokens=4)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == 4
    assert all(entry.logprob == -0.25 and len(entry.top_logprobs) == 2 for entry in entries)
    first_token = live.engine.reply_ids(live.engine.last.prompt)[0]
    assert entries[0].token == live.frontend.tokenizer.decode([first_token])


async def test_completion_with_a_text_prompt(live: LiveServer):
    reply = await live.openai().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=64)
    assert reply.choices[0].text == DEFAULT_ANSWER
    assert reply.choices[0].finish_reason == "stop"
    assert live.frontend.calls[-1][0] == "text"


async def test_completion_with_token_ids_echo_and_logprobs(live: LiveServer):
    prompt_ids = live.frontend.tokenizer.encode("Tokens in")
    reply = await live.openai().completions.create(model=MODEL, prompt=prompt_ids, max_tokens=5, echo=True,
                                                   logprobs=1)
    assert reply.choices[0].text == "Tokens in" + DEFAULT_ANSWER[:5]
    assert reply.choices[0].finish_reason == "length"
    assert len(reply.choices[0].logprobs.tokens) == 5
    assert reply.choices[0].logprobs.text_offset[0] == len("Tokens in")
    assert live.engine.last.prompt.token_ids == tuple(prompt_ids)


async def test_streamed_completion_with_usage(live: LiveServer):
    stream = await live.openai().completions.create(model=MODEL, prompt="Say", max_tokens=64, stream=True,
                                                    stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(choice.text for chunk in chunks for choice in chunk.choices) == DEFAULT_ANSWER
    assert chunks[-1].usage.completion_tokens == len(live.engine.reply_ids(live.engine.last.prompt))


async def test_models_lists_the_served_model(start_server):
    server = await start_server(served_model_name="my-model")
    models = await server.openai().models.list()
    assert [model.id for model in models.data] == ["my-model"]
    reply = await server.openai().chat.completions.create(model="my-model", messages=HELLO, max_tokens=2)
    assert reply.model == "my-model"


async def test_cache_control_markers_in_openai_messages_become_breakpoints(live: LiveServer):
    marker = {"type": "ephemeral"}
    rules = {"type": "text", "text": "Rules. " * 20, "cache_control": marker}
    messages = [{"role": "system", "content": [rules]},
                {"role": "user", "content": "Question?"}]
    await live.openai().chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    assert live.frontend.last_call["breakpoints"] == (0,)
    assert any(kind == 1 for _, kind in live.engine.last.prompt.tap_hints)  # HintKind.EXPLICIT


async def test_completion_max_tokens_defaults_to_sixteen(live: LiveServer):
    await live.openai().completions.create(model=MODEL, prompt="Count")
    assert live.engine.last.sampling.max_tokens == 16


async def test_concurrent_streams_each_get_their_own_complete_answer(live: LiveServer):
    live.engine.token_delay_s = 0.001
    client = live.openai()

    async def one_stream(index: int) -> str:
        live_reply = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Request {index}"}], stream=True)
        return "".join([choice.delta.content or "" async for chunk in live_reply for choice in chunk.choices])

    answers = await asyncio.gather(*(one_stream(index) for index in range(8)))
    assert answers == [DEFAULT_ANSWER] * 8
    assert live.engine.max_running_seen > 1
    assert live.engine.running == 0
