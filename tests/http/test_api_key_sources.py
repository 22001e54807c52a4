"""API keys come from a file or the environment as well as argv, and can guard /metrics too."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import aiohttp
import pytest

from hybridcache.config import OptionError
from hybridcache.http.serve_command import add_arguments
from hybridcache.http.server_options import API_KEY_ENV, ServerOptions
from tests.http.conftest import LiveServer, StartServer


def server_options(*flags: str, environ: dict[str, str] | None = None) -> ServerOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return ServerOptions.from_args(parser.parse_args(list(flags)), environ or {})


def key_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_keys_come_from_the_file_the_environment_and_argv_together(tmp_path: Path):
    path = key_file(tmp_path, "# tenants\nkey-file-1\n\n  key-file-2  \n")
    options = server_options("--api-key", "key-argv", "--api-key-file", str(path),
                             environ={API_KEY_ENV: "key-env"})
    assert options.api_keys == ("key-argv", "key-file-1", "key-file-2", "key-env")


def test_the_environment_alone_turns_keys_on():
    assert server_options(environ={API_KEY_ENV: " secret "}).api_keys == ("secret",)
    assert server_options().api_keys == ()


@pytest.mark.parametrize(("setup", "fragment"), [
    (lambda tmp: tmp / "missing.txt", "cannot read"),
    (lambda tmp: key_file(tmp, "# only a comment\n\n"), "holds no key"),
    (lambda tmp: key_file(tmp, "key\n", mode=0o622), "group- or world-writable"),
])
def test_an_unusable_key_file_is_a_startup_error(tmp_path: Path, setup, fragment: str):
    with pytest.raises(OptionError, match=fragment) as caught:
        server_options("--api-key-file", str(setup(tmp_path)))
    assert caught.value.flag == "--api-key-file" and "\n" not in str(caught.value)


def test_an_empty_environment_key_is_refused():
    with pytest.raises(OptionError, match="empty"):
        server_options(environ={API_KEY_ENV: "  "})


def test_metrics_key_needs_a_key_configured():
    with pytest.raises(OptionError) as caught:
        server_options("--metrics-require-api-key")
    assert caught.value.flag == "--metrics-require-api-key"
    assert server_options("--metrics-require-api-key", environ={API_KEY_ENV: "k"}).metrics_require_api_key


async def get_status(live: LiveServer, path: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.get(live.root + path, headers=headers) as reply:
        return reply.status


async def test_metrics_can_require_the_key_while_health_never_does(start_server: StartServer):
    server = await start_server(api_keys=("key-alpha",), metrics_require_api_key=True)
    assert await get_status(server, "/metrics") == 401
    assert await get_status(server, "/metrics", "wrong") == 401
    assert await get_status(server, "/metrics", "key-alpha") == 200
    assert await get_status(server, "/health") == 200
    assert await get_status(server, "/v1/models") == 401
