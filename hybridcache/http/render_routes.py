"""What a router asks a replica before it routes: the prompt's token ids, and the served model.

POST /v1/chat/completions/render and /v1/completions/render answer ``{"token_ids": [...]}``: the ids the
engine would submit (and cache) for the same body, built by the same preparation the generating
endpoints run (chat template, cache salt, the context check), so a router that hashes them sees the
blocks this replica stores. Nothing is submitted. GET /server_info (and SGLang's older
/get_server_info) names the served model for routers that discover it. Unknown body fields are ignored,
as on the generating endpoints, so the fields a router adds never cause a 400.
"""

from __future__ import annotations

from aiohttp import web

from hybridcache import __version__
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.core.api import PreparedPrompt
from hybridcache.http.auth import request_cache_salt
from hybridcache.http.openai_chat import chat_prompt
from hybridcache.http.openai_completions import completion_prompt
from hybridcache.http.openai_schemas import ChatCompletionRequest, CompletionRequest
from hybridcache.http.replica_name import replica_name
from hybridcache.http.request_prep import decode_body, resolve_max_tokens
from hybridcache.http.state import ServerState, server_state


async def chat_render(request: web.Request) -> web.Response:
    """The token ids a chat request would submit. Raises ApiError as the chat endpoint would before it
    submits (bad fields, unknown model, a prompt that fills the context)."""
    state = server_state(request)
    body = await decode_body(request, ChatCompletionRequest)
    prompt, _ = await chat_prompt(request, state, body)
    resolve_max_tokens(None, prompt.num_tokens, state.max_model_len)
    return _rendered(state, prompt)


async def completion_render(request: web.Request) -> web.Response:
    """The token ids a completion request would submit. Raises ApiError as /v1/completions would."""
    state = server_state(request)
    body = await decode_body(request, CompletionRequest)
    state.check_model(body.model)
    prompt = await completion_prompt(state, body.prompt, request_cache_salt(request, body.cache_salt))
    resolve_max_tokens(None, prompt.num_tokens, state.max_model_len)
    return _rendered(state, prompt)


async def server_info(request: web.Request) -> web.Response:
    state = server_state(request)
    return web.json_response({
        "served_model_name": state.served_model_name,
        "model_path": state.engine.model_name,
        "max_model_len": state.max_model_len,
        "kv_block_size": BLOCK_TOKENS,
        "version": __version__,
        "replica_id": replica_name(request),
    })


def _rendered(state: ServerState, prompt: PreparedPrompt) -> web.Response:
    return web.json_response({"token_ids": list(prompt.token_ids), "num_tokens": prompt.num_tokens,
                              "model": state.served_model_name})
