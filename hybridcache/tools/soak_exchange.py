"""One HTTP exchange of the soak bench, read to its end and reduced to an `Exchange`: status, the reply
text, the usage, and any error frame a stream carried. OpenAI (JSON or `data:` frames ending in
`[DONE]`) and Anthropic (`event:`/`data:` frames ending in `message_stop`) bodies are both understood.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import aiohttp

CLIENT_ERROR_TYPES = frozenset({
    "invalid_request_error", "authentication_error", "not_found_error", "request_too_large",
    "rate_limit_error", "permission_error",
})


class Exchange(NamedTuple):
    status: int
    text: str = ""  # the generated text (content and reasoning, in order)
    usage: dict[str, Any] | None = None
    error_type: str | None = None  # the error's type: the refusal's, or a stream's error frame's
    complete: bool = True  # a stream that ended with its terminator (always True for a JSON body)
    detail: str = ""  # what to show when the exchange is a failure


async def post(session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str],
               stream: bool, stop_after_frames: int | None = None) -> Exchange:
    """POST `body` (a dict, or raw bytes sent as is) and read the reply. With `stop_after_frames`, the
    connection is dropped after that many data frames (a client gone mid-stream: `complete` False).
    Raises aiohttp.ClientError / TimeoutError on transport failures, ValueError on an unreadable body."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"Content-Type": "application/json", **headers}) as reply:
        if reply.status != 200 or not stream:
            raw = await reply.read()
            return _json_exchange(reply.status, raw)
        return await _read_stream(reply, stop_after_frames)


def _json_exchange(status: int, raw: bytes) -> Exchange:
    try:
        payload = json.loads(raw)
    except ValueError as error:
        raise ValueError(f"status {status}, unreadable body {raw[:200]!r}") from error
    if status != 200:
        error = payload.get("error", {}) if isinstance(payload, dict) else {}
        return Exchange(status, error_type=error.get("type"), detail=json.dumps(payload)[:300])
    return Exchange(status, _reply_text(payload), payload.get("usage"))


def _reply_text(payload: dict[str, Any]) -> str:
    if payload.get("type") == "message":  # Anthropic
        return "".join(block.get("text") or block.get("thinking") or "" for block in payload["content"])
    choice = payload["choices"][0]
    if "message" in choice:
        message = choice["message"]
        return (message.get("reasoning_content") or "") + (message.get("content") or "")
    return choice["text"]


async def _read_stream(reply: aiohttp.ClientResponse, stop_after_frames: int | None) -> Exchange:
    parts: list[str] = []
    usage = None
    frames = 0
    async for raw_line in reply.content:
        line = raw_line.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return Exchange(200, "".join(parts), usage)
        frame = json.loads(data)
        if "error" in frame or frame.get("type") == "error":
            error = frame.get("error", {})
            return Exchange(200, "".join(parts), usage, error.get("type"), detail=data[:300])
        if frame.get("type") == "message_stop":
            return Exchange(200, "".join(parts), usage)
        parts.append(_frame_text(frame))
        usage = frame.get("usage") or usage
        frames += 1
        if stop_after_frames is not None and frames >= stop_after_frames:
            reply.close()  # drop the connection: the server must cancel the request
            return Exchange(200, "".join(parts), usage, complete=False)
    return Exchange(200, "".join(parts), usage, complete=False,
                    detail="the stream ended without its terminator")


def _frame_text(frame: dict[str, Any]) -> str:
    if frame.get("type") == "content_block_delta":  # Anthropic
        delta = frame["delta"]
        return delta.get("text") or delta.get("thinking") or ""
    if "choices" not in frame or not frame["choices"]:
        return ""
    choice = frame["choices"][0]
    if "delta" in choice:
        delta = choice["delta"]
        return (delta.get("reasoning_content") or "") + (delta.get("content") or "")
    return choice.get("text") or ""
