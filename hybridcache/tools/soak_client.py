"""One soak client: a loop of randomly chosen requests against a live server until the deadline.

Each client belongs to one of two tenants (API keys, so their cache salts differ), keeps a chat that
grows turn by turn (so, over all clients, more context than the device pool holds: eviction and the
Host tier work), and mixes in completions over a preamble both tenants share, Anthropic messages,
requests it abandons mid-prefill or mid-decode, deliberately bad requests, and repeats of its own earlier
greedy requests whose replies must not change (whatever the cache held meanwhile, a resumed request
gives the cold run's tokens). Every request ends as one outcome in the shared `Tally`.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hybridcache.tools.soak_exchange import CLIENT_ERROR_TYPES, Exchange, post
from hybridcache.tools.soak_tally import Tally

WORDS = (
    "river", "stone", "cache", "window", "garden", "lamp", "paper", "orbit", "signal", "harbor", "maple",
    "copper", "lantern", "meadow", "pixel", "thunder", "velvet", "willow", "quartz", "ember", "falcon",
    "glacier", "harvest", "island", "jungle", "kettle", "ladder", "marble", "nectar", "oyster", "pepper",
    "quiver", "rocket", "saddle", "tunnel", "umbrella", "violet", "walnut", "yonder", "zephyr", "anchor",
    "bridge", "candle",
)
ACTIONS = {  # weights
    "chat_turn": 30, "completion": 14, "repeat": 8, "anthropic": 6, "cancel_prefill": 8,
    "disconnect_decode": 8, "abandon_blocking": 4, "bad_input": 10,
}
HISTORY_KEPT = 24
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ClientPlan:
    """What the clients send; sizes in words (the tiny tokenizer makes ~2-3 tokens of one)."""

    model: str
    max_conversation_tokens: int = 1800
    turn_words: tuple[int, int] = (30, 140)
    cold_prompt_words: tuple[int, int] = (300, 700)
    preamble_words: int = 250


@dataclass
class Sent:
    """A greedy request that succeeded, kept to be repeated: its reply must come back the same."""

    path: str
    body: dict[str, Any]
    key: str
    stream: bool
    text: str


@dataclass
class SoakClient:
    number: int
    url: str
    key: str
    plan: ClientPlan
    tally: Tally
    rng: random.Random
    preamble: str
    messages: list[dict[str, str]] = field(default_factory=list)
    history: list[Sent] = field(default_factory=list)

    async def run(self, deadline: float) -> None:
        """Send requests until the monotonic `deadline` (the request under way is finished)."""
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            names, weights = list(ACTIONS), list(ACTIONS.values())
            while time.monotonic() < deadline:
                action = self.rng.choices(names, weights)[0]
                await getattr(self, "_" + action)(session)

    # -- requests ---------------------------------------------------------------------------------
    async def _chat_turn(self, session: aiohttp.ClientSession) -> None:
        self.messages.append({"role": "user", "content": self._words(*self.plan.turn_words)})
        body = {"model": self.plan.model, "messages": list(self.messages), "temperature": 0.0,
                "max_tokens": self.rng.randint(6, 24)}
        stream = self.rng.random() < 0.5
        exchange = await self._send(session, "chat_turn", "/v1/chat/completions", body, self.key, stream)
        if exchange is None:
            self.messages.pop()
            return
        self._remember("/v1/chat/completions", body, self.key, stream, exchange.text)
        self.messages.append({"role": "assistant", "content": exchange.text})
        prompt_tokens = (exchange.usage or {}).get("prompt_tokens", 0)
        if prompt_tokens > self.plan.max_conversation_tokens:
            self.messages = []  # a new conversation; the old one stays in the cache until evicted

    async def _completion(self, session: aiohttp.ClientSession) -> None:
        body: dict[str, Any] = {"model": self.plan.model, "prompt": self.preamble + self._words(10, 60),
                                "temperature": 0.0, "max_tokens": self.rng.randint(4, 16)}
        if self.rng.random() < 0.2:
            body["cache_salt"] = f"sub-{self.rng.randint(0, 2)}"  # narrower sharing inside the tenant
        if self.rng.random() < 0.1:
            body["logprobs"] = 3
        stream = self.rng.random() < 0.5
        exchange = await self._send(session, "completion", "/v1/completions", body, self.key, stream)
        if exchange is not None:
            self._remember("/v1/completions", body, self.key, stream, exchange.text)

    async def _repeat(self, session: aiohttp.ClientSession) -> None:
        if not self.history:
            return await self._completion(session)
        sent = self.rng.choice(self.history)
        exchange = await self._send(session, "repeat", sent.path, sent.body, sent.key, sent.stream,
                                    count_ok=False)
        if exchange is None:
            return
        if exchange.text != sent.text:
            detail = f"{sent.path}: first {sent.text!r}, now {exchange.text!r}"
            self.tally.count("repeat", "wrong_reply", detail)
        else:
            self.tally.count("repeat", "ok")

    async def _anthropic(self, session: aiohttp.ClientSession) -> None:
        body = {"model": self.plan.model, "max_tokens": self.rng.randint(4, 16), "temperature": 0.0,
                "messages": [{"role": "user", "content": self.preamble + self._words(5, 30)}]}
        stream = self.rng.random() < 0.5
        exchange = await self._send(session, "anthropic", "/v1/messages", body, self.key, stream)
        if exchange is not None:
            self._remember("/v1/messages", body, self.key, stream, exchange.text)

    async def _cancel_prefill(self, session: aiohttp.ClientSession) -> None:
        """A cold prompt long enough to take a while to prefill, abandoned after a short random wait."""
        body = {"model": self.plan.model, "stream": True, "max_tokens": 32,
                "messages": [{"role": "user", "content": self._words(*self.plan.cold_prompt_words)}]}
        wait_s = self.rng.uniform(0.02, 0.4)
        try:
            exchange = await asyncio.wait_for(
                post(session, self.url + "/v1/chat/completions", body, self._auth(self.key), stream=True),
                wait_s)
        except TimeoutError:
            return self.tally.count("cancel_prefill", "cancelled")
        except (aiohttp.ClientError, ValueError) as error:
            return self.tally.count("cancel_prefill", "transport_error", repr(error))
        self._count_exchange("cancel_prefill", exchange)

    async def _disconnect_decode(self, session: aiohttp.ClientSession) -> None:
        path, body = self._long_reply_request()
        body["stream"] = True
        frames = self.rng.randint(1, 8)
        exchange = await self._send(session, "disconnect_decode", path, body, self.key, True,
                                    stop_after_frames=frames, count_ok=False)
        if exchange is not None:
            self.tally.count("disconnect_decode", "ok" if exchange.complete else "disconnected")

    async def _abandon_blocking(self, session: aiohttp.ClientSession) -> None:
        """A non-streaming request whose client stops waiting mid-decode."""
        path, body = self._long_reply_request()
        try:
            exchange = await asyncio.wait_for(
                post(session, self.url + path, body, self._auth(self.key), stream=False),
                self.rng.uniform(0.3, 1.5))
        except TimeoutError:
            return self.tally.count("abandon_blocking", "disconnected")
        except (aiohttp.ClientError, ValueError) as error:
            return self.tally.count("abandon_blocking", "transport_error", repr(error))
        self._count_exchange("abandon_blocking", exchange)

    async def _bad_input(self, session: aiohttp.ClientSession) -> None:
        name, path, body, key = self.rng.choice(self._bad_requests())
        try:
            exchange = await post(session, self.url + path, body, self._auth(key), stream=False)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            return self.tally.count(f"bad:{name}", "transport_error", repr(error))
        if 400 <= exchange.status < 500 and exchange.status != 429:
            return self.tally.count(f"bad:{name}", "expected_4xx")
        if exchange.status == 200:
            return self.tally.count(f"bad:{name}", "bad_input_accepted", f"{path} {body!r}"[:300])
        self._count_status(f"bad:{name}", exchange)

    def _bad_requests(self) -> list[tuple[str, str, Any, str]]:
        model, chat = self.plan.model, [{"role": "user", "content": "hello"}]
        return [
            ("malformed_json", "/v1/chat/completions", b'{"model": "x", "messages": [', self.key),
            ("unknown_model", "/v1/chat/completions", {"model": "no-such-model", "messages": chat}, self.key),
            ("negative_max_tokens", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": -5},
             self.key),
            ("too_many_stops", "/v1/chat/completions",
             {"model": model, "messages": chat, "stop": [f"s{i}" for i in range(40)]}, self.key),
            ("no_messages_field", "/v1/chat/completions", {"model": model}, self.key),
            ("wrong_api_key", "/v1/completions", {"model": model, "prompt": "hi"}, "not-a-key"),
            ("top_logprobs_too_many", "/v1/chat/completions",
             {"model": model, "messages": chat, "logprobs": True, "top_logprobs": 50}, self.key),
            ("temperature_text", "/v1/completions", {"model": model, "prompt": "hi", "temperature": "hot"},
             self.key),
            ("anthropic_without_max_tokens", "/v1/messages", {"model": model, "messages": chat}, self.key),
            ("empty_cache_salt", "/v1/completions", {"model": model, "prompt": "hi", "cache_salt": ""},
             self.key),
        ]

    # -- helpers ----------------------------------------------------------------------------------
    def _long_reply_request(self) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {"model": self.plan.model, "max_tokens": 300, "temperature": 0.0,
                                "ignore_eos": True}
        if self.rng.random() < 0.5:
            return "/v1/completions", {**body, "prompt": self.preamble + self._words(5, 40)}
        return "/v1/chat/completions", {**body, "messages": [*self.messages,
                                                             {"role": "user", "content": self._words(5, 40)}]}

    async def _send(self, session: aiohttp.ClientSession, kind: str, path: str, body: dict[str, Any],
                    key: str, stream: bool, stop_after_frames: int | None = None,
                    count_ok: bool = True) -> Exchange | None:
        """The exchange when it succeeded (counted `ok` if `count_ok`; with `stop_after_frames` a stream
        the client dropped on purpose counts as success here), else None with its outcome counted."""
        try:
            exchange = await post(session, self.url + path, {**body, "stream": stream}, self._auth(key),
                                  stream, stop_after_frames)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            self.tally.count(kind, "transport_error", repr(error))
            return None
        dropped_on_purpose = stop_after_frames is not None and not exchange.complete and not exchange.detail
        finished = exchange.complete or dropped_on_purpose
        if exchange.status != 200 or exchange.error_type is not None or not finished:
            self._count_exchange(kind, exchange)
            if exchange.status == 429:
                await asyncio.sleep(0.5)
            return None
        if count_ok:
            self.tally.count(kind, "ok")
        return exchange

    def _count_exchange(self, kind: str, exchange: Exchange) -> None:
        if exchange.status != 200:
            return self._count_status(kind, exchange)
        if exchange.error_type is not None:
            outcome = "unexpected_4xx" if exchange.error_type in CLIENT_ERROR_TYPES else "unexpected_5xx"
            return self.tally.count(kind, outcome, f"error frame in the stream: {exchange.detail}")
        if not exchange.complete:
            return self.tally.count(kind, "transport_error", exchange.detail or "incomplete stream")
        self.tally.count(kind, "ok")

    def _count_status(self, kind: str, exchange: Exchange) -> None:
        if exchange.status == 429:
            return self.tally.count(kind, "rate_limited")
        outcome = "unexpected_5xx" if exchange.status >= 500 else "unexpected_4xx"
        self.tally.count(kind, outcome, f"status {exchange.status}: {exchange.detail}")

    def _remember(self, path: str, body: dict[str, Any], key: str, stream: bool, text: str) -> None:
        self.history.append(Sent(path, body, key, stream, text))
        del self.history[:-HISTORY_KEPT]

    def _auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}", "x-api-key": key}

    def _words(self, low: int, high: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(low, high)))
