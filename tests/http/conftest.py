"""Fixtures for the HTTP tests: a micro checkpoint's real frontend, a fake engine, and a live app on
127.0.0.1 (a free port) that the official openai / anthropic clients talk to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anthropic
import openai
import pytest
from aiohttp import web

from hybridcache.core.tokenizer import Tokenizer
from hybridcache.http.app import create_app
from hybridcache.http.server_options import ServerOptions
from tests.http.fakes import FakeEngine, RecordingFrontend

MAX_MODEL_LEN = 2048
MODEL = "fake-model"


@pytest.fixture(scope="session")
def micro_dir(micro_checkpoint: Path) -> Path:
    return micro_checkpoint


@pytest.fixture
def frontend(micro_dir: Path) -> RecordingFrontend:
    return RecordingFrontend.from_dir(micro_dir, MAX_MODEL_LEN)


@pytest.fixture
def tokenizer(frontend: RecordingFrontend) -> Tokenizer:
    return frontend.tokenizer


@pytest.fixture
def engine(tokenizer: Tokenizer) -> FakeEngine:
    return FakeEngine(tokenizer, model_name=MODEL, max_model_len=MAX_MODEL_LEN)


@dataclass
class LiveServer:
    runner: web.AppRunner
    engine: FakeEngine
    frontend: RecordingFrontend
    clients: list = field(default_factory=list)

    @property
    def root(self) -> str:
        host, port = self.runner.addresses[0][:2]
        return f"http://{host}:{port}"

    def openai(self, api_key: str = "none", **kwargs) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=self.root + "/v1", api_key=api_key, max_retries=0, **kwargs)
        self.clients.append(client)
        return client

    def anthropic(self, api_key: str = "none", **kwargs) -> anthropic.AsyncAnthropic:
        client = anthropic.AsyncAnthropic(base_url=self.root, api_key=api_key, max_retries=0, **kwargs)
        self.clients.append(client)
        return client


StartServer = Callable[..., Awaitable[LiveServer]]


@pytest.fixture
async def start_server(engine: FakeEngine, frontend: RecordingFrontend) -> AsyncIterator[StartServer]:
    """Start the app on 127.0.0.1 (a free port) with the given ServerOptions fields, the way `serve` runs
    it (no handler cancellation unless asked); every server started is closed afterwards."""
    started: list[LiveServer] = []

    async def start(handler_cancellation: bool = False, **options) -> LiveServer:
        app = create_app(engine, frontend, ServerOptions(**options))
        runner = web.AppRunner(app, handler_cancellation=handler_cancellation)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        started.append(LiveServer(runner, engine, frontend))
        return started[-1]

    yield start
    for live in started:
        for client in live.clients:
            await client.close()
        await live.runner.cleanup()


@pytest.fixture
async def live(start_server: StartServer) -> LiveServer:
    return await start_server()
