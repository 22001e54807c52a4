"""API keys guard /v1/ routes, and each key hashes its prompts under its own cache salt."""

from __future__ import annotations

import aiohttp
import anthropic
import openai
import pytest

from hybridcache.http.auth import key_salt
from tests.http.conftest import MODEL, LiveServer, StartServer

KEYS = ("key-alpha", "key-beta")
HELLO = [{"role": "user", "content": "Hi"}]


def long_prompt() -> list[dict]:
    return [{"role": "system", "content": "Shared instructions for every tenant. " * 12}, *HELLO]


@pytest.fixture
async def keyed(start_server: StartServer) -> LiveServer:
    return await start_server(api_keys=KEYS)


async def test_a_wrong_or_missing_key_is_401_in_each_envelope(keyed: LiveServer):
    with pytest.raises(openai.AuthenticationError) as openai_refusal:
        await keyed.openai(api_key="wrong").chat.completions.create(model=MODEL, messages=HELLO)
    assert openai_refusal.value.status_code == 401
    assert openai_refusal.value.body["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError) as anthropic_refusal:
        await keyed.anthropic(api_key="wrong").messages.create(model=MODEL, max_tokens=2, messages=HELLO)
    assert anthropic_refusal.value.body["error"]["type"] == "authentication_error"
    async with aiohttp.ClientSession() as session, session.get(keyed.root + "/v1/models") as reply:
        assert reply.status == 401
    assert keyed.engine.submissions == []


async def test_a_good_key_is_served_by_either_header(keyed: LiveServer):
    reply = await keyed.openai(api_key="key-alpha").chat.completions.create(model=MODEL, messages=HELLO)
    assert reply.choices[0].message.content
    message = await keyed.anthropic(api_key="key-beta").messages.create(model=MODEL, max_tokens=64,
                                                                        messages=HELLO)
    assert message.content[-1].text


async def test_health_and_metrics_need_no_key(keyed: LiveServer):
    async with aiohttp.ClientSession() as session:
        for path in ("/health", "/metrics"):
            async with session.get(keyed.root + path) as reply:
                assert reply.status == 200


async def test_each_key_gets_its_own_salt_and_a_request_salt_narrows_it(keyed: LiveServer):
    client = keyed.openai(api_key="key-alpha")
    await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2)
    assert keyed.frontend.last_call["cache_salt"] == key_salt("key-alpha")
    await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2,
                                         extra_body={"cache_salt": "project-1"})
    assert keyed.frontend.last_call["cache_salt"] == key_salt("key-alpha") + "/project-1"
    assert "key-alpha" not in key_salt("key-alpha")


async def test_tenants_never_share_cached_prefixes(keyed: LiveServer):
    alpha, beta = keyed.openai(api_key="key-alpha"), keyed.openai(api_key="key-beta")
    await alpha.chat.completions.create(model=MODEL, messages=long_prompt(), max_tokens=2)
    from_beta = await beta.chat.completions.create(model=MODEL, messages=long_prompt(), max_tokens=2)
    # a request salt cannot escape its tenant: beta asking for alpha's salt text still misses
    spoofed = await beta.chat.completions.create(model=MODEL, messages=long_prompt(), max_tokens=2,
                                                 extra_body={"cache_salt": key_salt("key-alpha")})
    again = await alpha.chat.completions.create(model=MODEL, messages=long_prompt(), max_tokens=2)
    assert from_beta.usage.prompt_tokens_details.cached_tokens == 0
    assert spoofed.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens > 0
