"""The endpoints routers call before they route: render answers exactly the prompt the generating
endpoint submits, submits nothing, ignores the fields routers add; /server_info names the model."""

from __future__ import annotations

import aiohttp

from tests.http.conftest import MODEL, LiveServer

CHAT = {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What is a prefix cache?"}],
        "max_tokens": 4}
# What sglang-router and vllm-router add to a chat body (SGLang-only fields, router bookkeeping).
ROUTER_FIELDS = {"separate_reasoning": True, "stream_reasoning": True, "return_hidden_states": False,
                 "lora_path": None, "no_stop_trim": False, "regex": None, "ebnf": None,
                 "session_params": None, "continue_final_message": False, "skip_special_tokens": True,
                 "bootstrap_host": None, "rid": "abc", "logit_bias": {"12": 1.0}}


async def post(live: LiveServer, path: str, body: dict, **headers: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, \
            session.post(live.root + path, json=body, headers=headers) as response:
        return response.status, await response.json()


async def get(live: LiveServer, path: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.get(live.root + path) as response:
        return response.status, await response.json()


async def test_chat_render_is_the_submitted_prompt_and_submits_nothing(live: LiveServer):
    status, rendered = await post(live, "/v1/chat/completions/render", CHAT)
    assert status == 200
    assert live.engine.submissions == []
    status, _ = await post(live, "/v1/chat/completions", CHAT)
    assert status == 200
    assert rendered["token_ids"] == list(live.engine.submissions[-1].prompt.token_ids)
    assert rendered["num_tokens"] == len(rendered["token_ids"])


async def test_completion_render_of_text_and_of_token_ids(live: LiveServer):
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 3}
    status, rendered = await post(live, "/v1/completions/render", body)
    assert status == 200
    await post(live, "/v1/completions", body)
    assert rendered["token_ids"] == list(live.engine.submissions[-1].prompt.token_ids)
    status, again = await post(live, "/v1/completions/render", {**body, "prompt": rendered["token_ids"]})
    assert (status, again["token_ids"]) == (200, rendered["token_ids"])


async def test_router_added_fields_are_ignored_not_refused(live: LiveServer):
    plain = await post(live, "/v1/chat/completions/render", CHAT)
    with_fields = await post(live, "/v1/chat/completions/render", {**CHAT, **ROUTER_FIELDS})
    assert with_fields == plain
    status, _ = await post(live, "/v1/chat/completions", {**CHAT, **ROUTER_FIELDS})
    assert status == 200


async def test_render_follows_the_cache_salt_like_generation(live: LiveServer):
    """A salted prompt renders the same ids (the salt changes block hashes, not tokens) and both
    generation and render accept it."""
    status, salted = await post(live, "/v1/chat/completions/render", {**CHAT, "cache_salt": "tenant-a"})
    assert status == 200
    assert salted["token_ids"] == (await post(live, "/v1/chat/completions/render", CHAT))[1]["token_ids"]


async def test_render_refuses_what_generation_refuses(live: LiveServer):
    status, body = await post(live, "/v1/chat/completions/render", {**CHAT, "model": "other"})
    assert status == 404 and body["error"]["param"] == "model"
    status, body = await post(live, "/v1/chat/completions/render", {**CHAT, "messages": []})
    assert status == 400 and body["error"]["param"] == "messages"
    status, body = await post(live, "/v1/completions/render", {"model": MODEL, "prompt": "x" * 20000})
    assert status == 400 and "maximum context length" in body["error"]["message"]


async def test_server_info_names_the_served_model(live: LiveServer):
    for path in ("/server_info", "/get_server_info"):
        status, info = await get(live, path)
        assert status == 200
        assert info["served_model_name"] == MODEL
        assert info["kv_block_size"] == 64
        assert info["max_model_len"] == live.engine.max_model_len
