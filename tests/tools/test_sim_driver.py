"""The simulator's request driver plans taps as the engine's worker does (before the lane activates)."""

from __future__ import annotations

import json
from pathlib import Path

from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.tap_planner import HintKind, TapHint, derive_tap_options
from hybridcache.tools.sim.counters import EvictionTally, SimCounters
from hybridcache.tools.sim.driver import Admission, RequestDriver
from hybridcache.tools.sim.material import RequestMaterial, build_material
from hybridcache.tools.sim.policies import Policy, make_cache
from hybridcache.tools.sim.shapes import get_shape
from hybridcache.tools.traces import load_trace

TINY = get_shape("tiny")


# --- factories -------------------------------------------------------------------------------------------


def echoing_conversation(tmp_path: Path) -> list[RequestMaterial]:
    """Turn 0: 200 prompt tokens, 100 out; turn 1 (400 tokens) echoes them, so it resumes from turn 0's
    endpoint at 299."""
    requests = [
        {"t": 0.0, "type": "n", "in": 200, "out": 100, "hash_ids": [1, 2, 3]},
        {"t": 30.0, "type": "n", "in": 400, "out": 5, "hash_ids": [1, 2, 3, 4, 5, 6]},
    ]
    path = tmp_path / "echo.json"
    path.write_text(json.dumps({"block_size": 64, "requests": requests}))
    (conversation,) = load_trace(path).conversations
    first, second = conversation.requests
    return [build_material(first, second, True, 0), build_material(second, None, True, 1)]


def new_driver(hedges: bool = True) -> RequestDriver:
    counters = SimCounters()
    geometry = TINY.geometry(512, 64, 4, 5)
    cache = make_cache(Policy.OURS, geometry, TINY.cost, EvictionTally(counters))
    options = derive_tap_options(TINY.cost.prefill_chunk_tokens, geometry.has_host_tier, hedges=hedges)
    return RequestDriver(cache, Policy.OURS, TINY, options, counters)


def serve(driver: RequestDriver, material: RequestMaterial, hints: list[TapHint]) -> None:
    """Admit, run and finish one request."""
    admitted = driver.admit(material, hints)
    assert admitted.outcome == Admission.STARTED and admitted.lane is not None
    driver.finish(admitted.lane)


# --- assertions ------------------------------------------------------------------------------------------


def assert_resumed_at(driver: RequestDriver, before: int, material: RequestMaterial, frontier: int) -> None:
    assert driver.counters.computed_tokens - before == material.prompt_tokens - frontier


def snapshot_frontiers(driver: RequestDriver) -> set[int]:
    return {snap.frontier for snap in driver.cache.index.snapshots.values()}


# --- stories ---------------------------------------------------------------------------------------------


def test_a_request_resumed_from_an_endpoint_takes_no_opener_tap(tmp_path):
    first, second = echoing_conversation(tmp_path)
    driver = new_driver(hedges=False)  # the hedge at the last block boundary would lie at 384 too
    serve(driver, first, [])
    taps_of_first_turn = driver.counters.taps_taken
    computed = driver.counters.computed_tokens
    serve(driver, second, [TapHint(384, HintKind.OPENER)])
    assert_resumed_at(driver, computed, second, 299)
    # only the prompt tail is tapped, at n - 1 = 399; the opener at 384 is skipped after an endpoint resume
    assert driver.counters.taps_taken - taps_of_first_turn == 1
    assert 399 in snapshot_frontiers(driver) and 384 not in snapshot_frontiers(driver)
    check_integrity(driver.cache.index)


def test_a_fresh_request_takes_its_opener_tap(tmp_path):
    first, _ = echoing_conversation(tmp_path)
    driver = new_driver()
    serve(driver, first, [TapHint(128, HintKind.OPENER)])
    # the opener at 128 and the prompt tail at n - 1 = 199, more than 64 tokens after it
    assert driver.counters.taps_taken == 2
    assert {128, 199} <= snapshot_frontiers(driver)
    check_integrity(driver.cache.index)
