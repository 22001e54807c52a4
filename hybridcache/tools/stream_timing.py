"""Timing one streamed `/v1/completions` request over loopback, the same way for any OpenAI-style server.

The prompt goes as token ids (so both sides of a comparison see exactly the same tokens, whatever their
tokenizers do), greedy, with `ignore_eos` so every run generates exactly `max_tokens` tokens. The client
records when each streamed chunk arrives: the first one ends the prefill (time to first token), and the
decode rate is the tokens after the first over the time from the first chunk to the last.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Sequence
from typing import NamedTuple
from urllib.parse import urlsplit


class StreamTiming(NamedTuple):
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    decode_s: float

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tok_s(self) -> float:
        return (self.generated_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0


class StreamError(RuntimeError):
    """The server answered with an error status or a stream without tokens."""


def timed_completion(
    url: str,
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    timeout_s: float = 900.0,
    arrivals: list[float] | None = None,
) -> StreamTiming:
    """Send one streamed completion of `prompt` (token ids) to the server at `url`; raises StreamError.

    `arrivals`, when given, receives the `time.perf_counter()` of every token chunk (mutated)."""
    parts = urlsplit(url)
    body = json.dumps(
        {
            "model": model,
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
    )
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    try:
        started = time.perf_counter()
        connection.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise StreamError(f"{url}: HTTP {response.status}: {response.read()[:300]!r}")
        arrivals = arrivals if arrivals is not None else []
        arrivals.extend(time.perf_counter() for _ in _token_chunks(response))
    finally:
        connection.close()
    if not arrivals:
        raise StreamError(f"{url}: the stream carried no tokens")
    return StreamTiming(len(prompt), max_tokens, arrivals[0] - started, arrivals[-1] - arrivals[0])


def _token_chunks(response: http.client.HTTPResponse):
    """Yield once per server-sent event that carries a choice (a token; some may hold no text yet)."""
    for raw in response:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        event = json.loads(payload)
        if event.get("choices"):
            yield event
