"""GET /v1/cache/integrity: 200 when the index rebuilds clean, 500 naming the problem when it does not."""

from __future__ import annotations

import json

from tests.http.conftest import LiveServer
from tests.http.test_metrics import get


async def test_a_clean_index_answers_200(live: LiveServer):
    status, body = await get(live, "/v1/cache/integrity")
    assert (status, json.loads(body)) == (200, {"clean": True})


async def test_a_broken_index_answers_500_naming_the_first_problem(live: LiveServer):
    live.engine.integrity_problem = "node 7: active_refs 1, lanes map it 0 times"
    status, body = await get(live, "/v1/cache/integrity")
    assert status == 500
    assert json.loads(body) == {"clean": False, "problem": "node 7: active_refs 1, lanes map it 0 times"}
