"""Every response names the replica that answered (`x-hybridcache-replica`), streamed, plain and refused
alike, so a client behind a router can tell misrouting from eviction; /server_info names it too."""

from __future__ import annotations

import argparse

import aiohttp
import pytest

from hybridcache.config import OptionError
from hybridcache.http.replica_name import REPLICA_HEADER
from hybridcache.http.serve_command import add_arguments
from hybridcache.http.server_options import ServerOptions
from tests.http.conftest import MODEL, StartServer


def server_options(*flags: str) -> ServerOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return ServerOptions.from_args(parser.parse_args(list(flags)), {})


def test_the_name_defaults_to_the_address_and_refuses_what_a_header_cannot_carry():
    assert server_options("--port", "8123").replica_name() == "127.0.0.1:8123"
    assert server_options("--port", "0").replica_name(bound_port=4321) == "127.0.0.1:4321"
    assert server_options("--replica-id", "r1").replica_name(bound_port=4321) == "r1"
    for bad in ("", "two words", "x" * 65, "r\n1"):
        with pytest.raises(OptionError, match="--replica-id"):
            server_options("--replica-id", bad)


async def test_streamed_plain_and_refused_responses_all_name_the_replica(start_server: StartServer):
    live = await start_server(replica_id="r7")
    body = {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 3}
    async with aiohttp.ClientSession() as session:
        async with session.post(live.root + "/v1/completions", json={**body, "stream": True}) as streamed:
            assert streamed.status == 200
            assert streamed.headers[REPLICA_HEADER] == "r7"
            await streamed.read()
        async with session.post(live.root + "/v1/completions", json=body) as plain:
            assert (plain.status, plain.headers[REPLICA_HEADER]) == (200, "r7")
        async with session.post(live.root + "/v1/completions", json={**body, "model": "other"}) as refused:
            assert (refused.status, refused.headers[REPLICA_HEADER]) == (404, "r7")
        async with session.get(live.root + "/server_info") as info:
            assert (await info.json())["replica_id"] == "r7"
            assert info.headers[REPLICA_HEADER] == "r7"
