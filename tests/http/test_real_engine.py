"""The HTTP layer on the real engine with the `tiny` checkpoint (Qwen3.5's vocabulary and chat
template): official clients, cache reuse reported in usage, exact greedy output with the cache on and
off, tenants isolated, bad bursts leave the cache intact."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import openai
import pytest
from aiohttp import web

from hybridcache.config import CacheOptions, EngineOptions, resolve_options
from hybridcache.core.engine import Engine
from hybridcache.core.frontend import Frontend
from hybridcache.http.app import create_app
from hybridcache.http.server_options import ServerOptions

SYSTEM = "You are a helpful assistant who answers briefly and checks every claim twice. " * 30
MODEL = "tiny"


class RealServer:
    def __init__(self, engine: Engine, runner: web.AppRunner) -> None:
        self.engine = engine
        self.runner = runner
        host, port = runner.addresses[0][:2]
        self.root = f"http://{host}:{port}"
        self.openai = openai.AsyncOpenAI(base_url=self.root + "/v1", api_key="none", max_retries=0)
        self.anthropic = anthropic.AsyncAnthropic(base_url=self.root, api_key="none", max_retries=0)

    async def close(self) -> None:
        await self.openai.close()
        await self.anthropic.close()
        await self.runner.cleanup()
        await self.engine.stop()


async def start_real_server(model_dir: Path, **cache_options) -> RealServer:
    options = resolve_options(
        EngineOptions(
            model=str(model_dir),
            prefill_chunk=256,
            max_concurrency=2,
            kv_capacity=512,
            cache=CacheOptions(**cache_options),
        )
    )
    engine = Engine(model_dir, options, model_name=MODEL, debug_integrity=True)
    await engine.start()
    frontend = Frontend.from_dir(model_dir, engine.max_model_len)
    runner = web.AppRunner(create_app(engine, frontend, ServerOptions(served_model_name=MODEL)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return RealServer(engine, runner)


@pytest.fixture
async def server(tiny_checkpoint: Path) -> AsyncIterator[RealServer]:
    live = await start_real_server(tiny_checkpoint, host_cache_mib=64)
    yield live
    await live.close()


def conversation(*user_turns: str) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    for turn in user_turns:
        messages.append({"role": "user", "content": turn})
    return messages


async def chat(client: openai.AsyncOpenAI, messages: list[dict], max_tokens: int = 12, **kwargs):
    return await client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0, **kwargs
    )


async def test_a_second_turn_reports_cached_tokens_openai(server: RealServer):
    first = await chat(server.openai, conversation("What is a hybrid model?"))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    answer = first.choices[0].message.content or ""
    follow = conversation("What is a hybrid model?")
    follow += [{"role": "assistant", "content": answer}, {"role": "user", "content": "And why cache it?"}]
    second = await chat(server.openai, follow)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= 64  # the opener tap of the first turn, at its token
    assert cached < second.usage.prompt_tokens
    server.engine.check_integrity()


async def test_a_second_turn_reports_cache_reads_anthropic(server: RealServer):
    question = {"type": "text", "text": "Describe a radix tree and how a prefix cache uses it. " * 8,
                "cache_control": {"type": "ephemeral"}}
    messages: list[dict] = [{"role": "user", "content": [question]}]
    first = await server.anthropic.messages.create(
        model=MODEL, max_tokens=10, system=SYSTEM, messages=messages
    )
    assert first.usage.cache_read_input_tokens == 0
    prompt_tokens = first.usage.input_tokens + first.usage.cache_creation_input_tokens
    assert first.usage.cache_creation_input_tokens == prompt_tokens // 64 * 64 > 0  # every whole block
    text = "".join(block.text for block in first.content if block.type == "text") or "ok"
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Shorter."}]
    second = await server.anthropic.messages.create(
        model=MODEL, max_tokens=10, system=SYSTEM, messages=messages
    )
    assert second.usage.cache_read_input_tokens > 0
    assert second.usage.cache_creation_input_tokens % 64 == 0
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens > first.usage.input_tokens


async def test_greedy_output_is_identical_with_the_cache_on_and_off(tiny_checkpoint: Path):
    on = await start_real_server(tiny_checkpoint, host_cache_mib=64)
    off = await start_real_server(tiny_checkpoint, prefix_reuse=False)
    try:
        messages = conversation("Tell me a story about caches.")
        answers = {}
        for name, live in (("on", on), ("off", off)):
            outputs = []
            for _ in range(2):  # the second request resumes from the cache when it is on
                reply = await chat(live.openai, messages, max_tokens=24)
                outputs.append(
                    (reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens)
                )
            answers[name] = outputs
        assert answers["on"][1][1] > 0 and answers["off"][1][1] == 0
        texts = {text for outputs in answers.values() for text, _ in outputs}
        assert len(texts) == 1
    finally:
        await on.close()
        await off.close()


async def test_two_salts_never_share_reuse(server: RealServer):
    messages = conversation("Same words for both tenants.")
    await chat(server.openai, messages, extra_body={"cache_salt": "tenant-a"})
    same = await chat(server.openai, messages, extra_body={"cache_salt": "tenant-a"})
    other = await chat(server.openai, messages, extra_body={"cache_salt": "tenant-b"})
    assert same.usage.prompt_tokens_details.cached_tokens > 0
    assert other.usage.prompt_tokens_details.cached_tokens == 0


async def test_a_burst_of_bad_requests_leaves_the_server_and_cache_intact(server: RealServer):
    bad_calls = [
        lambda: server.openai.chat.completions.create(model=MODEL, messages=[]),
        lambda: server.openai.chat.completions.create(model="nope", messages=conversation("x")),
        lambda: server.openai.chat.completions.create(model=MODEL, messages=conversation("x"), max_tokens=-1),
        lambda: server.openai.chat.completions.create(model=MODEL, messages=conversation("x"), n=3),
        lambda: server.openai.completions.create(model=MODEL, prompt="x" * 10, max_tokens=10**7),
    ]
    for call in bad_calls * 3:
        with pytest.raises(openai.APIStatusError) as caught:
            await call()
        assert 400 <= caught.value.status_code < 500
    good = await chat(server.openai, conversation("Still there?"))
    assert good.choices[0].finish_reason in ("stop", "length")
    server.engine.check_integrity()


async def test_a_client_leaving_mid_stream_releases_its_lane(server: RealServer):
    stream = await server.openai.chat.completions.create(
        model=MODEL,
        messages=conversation("Stream a long answer."),
        max_tokens=2000,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    received = 0
    async for _chunk in stream:
        received += 1
        if received == 5:
            break
    await stream.close()
    for _ in range(100):
        if server.engine.stats()["requests_running"] == 0:
            break
        await asyncio.sleep(0.05)
    assert server.engine.stats()["requests_running"] == 0
    server.engine.check_integrity()


async def test_streaming_chat_and_completions_on_the_real_engine(server: RealServer):
    reply = await chat(server.openai, conversation("Stream please."), max_tokens=16)
    stream = await server.openai.chat.completions.create(
        model=MODEL,
        messages=conversation("Stream please."),
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, reasoning, usage = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
    message = reply.choices[0].message
    assert "".join(pieces) == (message.content or "")
    assert "".join(reasoning) == (getattr(message, "reasoning_content", None) or "")
    assert usage is not None and usage.completion_tokens == reply.usage.completion_tokens
    completion = await server.openai.completions.create(
        model=MODEL, prompt="The cache", max_tokens=8, temperature=0
    )
    assert completion.usage.completion_tokens == 8 and completion.choices[0].finish_reason == "length"


async def test_logit_bias_steers_greedy_decoding_on_the_real_engine(server: RealServer):
    prompt = [1000, 2000, 3000, 4000]
    forced = 1234
    plain = await server.openai.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0)
    steered = await server.openai.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, logit_bias={str(forced): 100}
    )
    expected = server.engine.tokenizer.decode([forced] * 4)
    assert plain.choices[0].text != expected
    assert steered.choices[0].text == expected
