"""`hybridcache simulate`: accounting on hand-checked traces, the bound, policies, determinism, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridcache.cache.integrity import check_integrity
from hybridcache.gpu.state_slots import StateShape, StateSlots
from hybridcache.tools import simulate as simulate_cli
from hybridcache.tools.sim.bound import InfiniteCacheBound
from hybridcache.tools.sim.excess import ExcessSplit
from hybridcache.tools.sim.material import build_material, chain_hashes
from hybridcache.tools.sim.oracle import NEVER, FutureUses
from hybridcache.tools.sim.policies import Policy
from hybridcache.tools.sim.runner import SimConfig, SimResult, Simulation, simulate_with_oracle
from hybridcache.tools.sim.shapes import SHAPES, get_shape
from hybridcache.tools.tiny_model.presets import get_preset
from hybridcache.tools.traces import Trace, load_trace

TINY = get_shape("tiny")


# --- factories -------------------------------------------------------------------------------------------

def weka_request(t: float, tokens: int, out: int, ids: list[int]) -> dict:
    """One WEKA request: ``ids`` lists the full 64-token blocks (the reader adds a partial tail id)."""
    assert len(ids) == tokens // 64
    return {"t": t, "type": "n", "in": tokens, "out": out, "hash_ids": ids}


def write_weka(path: Path, requests: list[dict], prefix_tokens: int = 0) -> Path:
    body = {"block_size": 64, "hash_id_scope": "local", "tool_tokens": prefix_tokens, "system_tokens": 0,
            "requests": requests}
    path.write_text(json.dumps(body))
    return path


def growing_conversation(tmp_path: Path) -> Path:
    """Turn 0: 200 tokens (3 full blocks + 8), 100 out. Turn 1 extends it to 400 (echo fits: 300 <= 400)."""
    return write_weka(tmp_path / "grow.json", [
        weka_request(0.0, 200, 100, [1, 2, 3]),
        weka_request(30.0, 400, 5, [1, 2, 3, 4, 5, 6]),
    ])


def story_traces(tmp_path: Path) -> list[Path]:
    """Two conversations sharing a 128-token tool + system prefix; one grows over three turns and starts a
    sub-agent; partial last blocks everywhere."""
    alpha = write_weka(tmp_path / "alpha.json", [
        weka_request(0.0, 700, 40, list(range(1, 11))),
        weka_request(20.0, 900, 30, list(range(1, 15))),
        {"t": 25.0, "type": "subagent", "agent_id": "helper", "subagent_type": "explore",
         "tool_tokens": 128, "system_tokens": 0,
         "requests": [weka_request(0.0, 400, 20, [1, 2, 50, 51, 52, 53]),
                      weka_request(5.0, 500, 10, [1, 2, 50, 51, 52, 53, 54])]},
        weka_request(60.0, 1300, 12, list(range(1, 21))),
    ], prefix_tokens=128)
    beta = write_weka(tmp_path / "beta.json", [
        weka_request(0.0, 650, 25, [7, 8, *range(100, 108)]),
        weka_request(15.0, 780, 9, [7, 8, *range(100, 110)]),
    ], prefix_tokens=128)
    return [alpha, beta]


def config(policy: Policy = Policy.OURS, **overrides) -> SimConfig:
    settings_ = {"shape": TINY, "policy": policy, "host_cache_mib": 64, "device_pages": 512,
                 "max_concurrency": 4, "users": 2}
    settings_.update(overrides)
    return SimConfig(**settings_)


def run(trace: Trace, cfg: SimConfig) -> tuple[Simulation, SimResult]:
    sim = Simulation(trace, cfg)
    return sim, sim.run()


# --- assertions ------------------------------------------------------------------------------------------

def assert_accounting_adds_up(result: SimResult, trace: Trace) -> None:
    c = result.counters
    assert c.requests + c.requests_infeasible == trace.num_requests
    assert c.input_tokens == trace.input_tokens
    assert c.computed_tokens + c.reused_tokens_device_kv + c.reused_tokens_host_kv == c.input_tokens
    assert c.computed_tokens >= c.requests  # at least one token each
    assert (c.restored_kv_bytes > 0) == (c.reused_tokens_host_kv > 0)  # KV back from the host is reused
    assert (c.host_resumed_requests > 0) == (c.restored_kv_bytes + c.restored_state_bytes > 0)


def assert_excess_is_split(result: SimResult) -> None:
    """Every request's tokens past its own bound are charged to capacity or placement (sim/excess.py);
    a request can only fall below its bound, never the split below zero."""
    c = result.counters
    assert c.excess_capacity_tokens >= 0 and c.excess_placement_tokens >= 0
    assert c.excess_capacity_tokens + c.excess_placement_tokens >= c.computed_tokens - result.bound_tokens
    assert c.excess_capacity_requests <= c.requests and c.excess_placement_requests <= c.requests
    by_idle = (
        c.excess_capacity_tokens_first_request,
        c.excess_capacity_tokens_idle_under_5m,
        c.excess_capacity_tokens_idle_5_to_30m,
        c.excess_capacity_tokens_idle_over_30m,
    )
    assert min(by_idle) >= 0 and sum(by_idle) == c.excess_capacity_tokens


def assert_restores_split_kv_from_state(result: SimResult, cfg: SimConfig) -> None:
    """KV bytes are whole pages, state bytes whole snapshot images."""
    c, shape = result.counters, cfg.shape
    assert c.restored_kv_bytes % shape.page_bytes == 0
    assert c.restored_state_bytes % shape.image_bytes == 0


def assert_at_or_above_bound(result: SimResult) -> None:
    assert result.counters.computed_tokens >= result.bound_tokens


# --- the bound, by hand ----------------------------------------------------------------------------------

def test_bound_by_hand_with_echo(tmp_path):
    trace = load_trace(growing_conversation(tmp_path))
    first, second = trace.conversations[0].requests
    bound = InfiniteCacheBound()
    assert bound.observe(build_material(first, second, True, 0)) == 200  # nothing seen: all 200
    # turn 0 committed 200 + 100 - 1 = 299 tokens that turn 1 repeats: 400 - 299
    assert bound.observe(build_material(second, None, True, 1)) == 101
    # the literal count: turn 0 has 3 new blocks + an 8-token tail + 1; turn 1 three new blocks,
    # a new 16-token tail, + 1
    assert bound.literal_tokens == (192 + 8 + 1) + (192 + 16 + 1)


def test_bound_by_hand_without_echo(tmp_path):
    trace = load_trace(growing_conversation(tmp_path))
    first, second = trace.conversations[0].requests
    bound = InfiniteCacheBound()
    bound.observe(build_material(first, second, False, 0))
    # the output is fresh tokens: only the 200 prompt tokens (3 blocks + the 8-token tail) are shared
    assert bound.observe(build_material(second, None, False, 1)) == 200


def test_identical_prompt_still_computes_one_token(tmp_path):
    path = write_weka(tmp_path / "same.json", [weka_request(0.0, 128, 4, [1, 2]),
                                               weka_request(9.0, 128, 4, [1, 2])])
    trace = load_trace(path)
    first, second = trace.conversations[0].requests
    bound = InfiniteCacheBound()
    bound.observe(build_material(first, second, True, 0))
    assert bound.observe(build_material(second, None, True, 1)) == 1


def test_chain_hashes_follow_the_prefix():
    import numpy as np

    tokens = np.arange(640, dtype=np.int64)
    edited = tokens.copy()
    edited[200] = 7
    same, other = chain_hashes(tokens).tolist(), chain_hashes(edited).tolist()
    assert same[:3] == other[:3] and all(a != b for a, b in zip(same[3:], other[3:]))
    assert chain_hashes(tokens[:300]).tolist() == same[:4]


# --- the simulator on hand-checked traces ----------------------------------------------------------------

def test_growing_conversation_resumes_from_the_endpoint(tmp_path):
    trace = load_trace(growing_conversation(tmp_path))
    _, result = run(trace, config())
    c = result.counters
    assert c.echoed_requests == 1
    # turn 0's endpoint lies 100 tokens past its prompt-tail tap; turn 1's (5 fresh tokens) within 64
    assert c.endpoints == 1
    assert c.computed_tokens == 200 + 101  # turn 1 resumes at 299, the echoed endpoint
    assert result.bound_tokens == 200 + 101
    assert result.computed_vs_bound == 1.0


def test_without_echo_the_prompt_tail_tap_serves(tmp_path):
    trace = load_trace(growing_conversation(tmp_path))
    _, result = run(trace, config(assume_echo=False))
    assert result.counters.echoed_requests == 0
    assert result.counters.computed_tokens == 200 + 201  # resumes at 199 (the tail tap n - 1 of turn 0)
    assert result.bound_tokens == 200 + 200


@pytest.mark.parametrize("policy", list(Policy))
def test_every_policy_runs_the_story_and_keeps_the_index_sound(tmp_path, policy):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    sim, result = run(trace, config(policy))
    assert_accounting_adds_up(result, trace)
    assert_at_or_above_bound(result)
    check_integrity(sim.driver.cache.index)
    assert result.counters.requests == 7


def test_sub_agent_and_second_conversation_reuse_the_shared_prefix(tmp_path):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    _, result = run(trace, config())
    # 7 requests, 5730 input tokens; without any reuse we would compute all of them
    assert result.counters.input_tokens == 700 + 900 + 400 + 500 + 1300 + 650 + 780
    assert result.counters.computed_tokens < result.counters.input_tokens / 2
    assert result.counters.reused_tokens_device_kv > 0


def test_align_computes_more_than_ours_on_a_growing_conversation(tmp_path):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    _, ours = run(trace, config(Policy.OURS))
    _, align = run(trace, config(Policy.ALIGN))
    assert align.counters.computed_tokens > ours.counters.computed_tokens
    assert align.bound_tokens == ours.bound_tokens


def test_small_host_tier_evicts_and_restores(tmp_path):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    for policy in (Policy.OURS, Policy.LRU):
        tight = config(policy, device_pages=26, host_cache_mib=1, max_concurrency=1, users=1)
        sim, result = run(trace, tight)
        assert_accounting_adds_up(result, trace)
        assert_restores_split_kv_from_state(result, tight)
        assert result.counters.restored_kv_bytes + result.counters.restored_state_bytes > 0
        assert result.counters.evicted_device_blocks + result.counters.deleted_subtrees > 0
        check_integrity(sim.driver.cache.index)


def test_same_inputs_same_numbers(tmp_path):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    for policy in Policy:
        _, first = run(trace, config(policy))
        _, second = run(trace, config(policy))
        assert first.counters == second.counters
        assert first.bound_tokens == second.bound_tokens


def test_mooncake_requests_share_global_blocks(tmp_path):
    lines = [{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]},
             {"timestamp": 500, "input_length": 1300, "output_length": 5, "hash_ids": [1, 2, 4]}]
    path = tmp_path / "moon.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines))
    trace = load_trace(path)
    _, result = run(trace, config())
    # the second request shares two 512-token blocks; the first ended mid-block 3 and left a
    # snapshot at 1024 (a ladder or tail tap) only if one was planned there: the bound says 1024 shared
    assert result.bound_tokens == 1100 + (1300 - 1024)
    assert_accounting_adds_up(result, trace)
    assert_at_or_above_bound(result)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 63), st.integers(1, 150)), min_size=1,
                   max_size=5),
    policy=st.sampled_from(list(Policy)),
    echo=st.booleans(),
)
def test_random_conversations_never_beat_the_bound(tmp_path_factory, turns, policy, echo):
    folder = tmp_path_factory.mktemp("random")
    requests, blocks, clock = [], 0, 0.0
    for grow, tail, out in turns:
        blocks += grow
        requests.append(weka_request(clock, blocks * 64 + tail, out, list(range(1, blocks + 1))))
        clock += 10.0
    trace = load_trace(write_weka(folder / "r.json", requests))
    sim, result = run(trace, config(policy, assume_echo=echo, host_cache_mib=2, device_pages=64))
    assert_accounting_adds_up(result, trace)
    assert_at_or_above_bound(result)
    assert_excess_is_split(result)
    check_integrity(sim.driver.cache.index)


def test_excess_split_by_hand(tmp_path):
    trace = load_trace(write_weka(tmp_path / "one.json", [weka_request(0.0, 640, 4, list(range(1, 11)))]))
    material = build_material(trace.conversations[0].requests[0], None, False, 0)
    split = ExcessSplit()
    # Resumed at 64 where the divergence point is 600: no snapshot was ever taken in (64, 600].
    split.charge(material, 640 - 64, 40)
    assert (split.capacity_tokens, split.placement_tokens) == (0, 536)
    # A snapshot once stood at 448 (after block 7) and another with a 5-token tail at 517: a request
    # that resumed at 64 lost 453 tokens to eviction and 83 to placement; one past the bound loses none.
    split.published(int(material.block_hashes[6]), ())
    split.published(int(material.block_hashes[7]), tuple(material.tokens[512:517].tolist()))
    split.published(int(material.block_hashes[8]), tuple(range(3)))  # not this prompt's tokens
    split.charge(material, 640 - 64, 40, idle_s=2000.0)
    assert (split.capacity_tokens, split.placement_tokens) == (453, 536 + 83)
    assert (split.capacity_requests, split.placement_requests) == (1, 2)
    split.charge(material, 40, 40)
    assert (split.capacity_tokens, split.placement_tokens) == (453, 619)
    # the capacity share went to the class of its conversation's idle time (over 30 minutes)
    assert split.capacity_by_idle == {
        "first_request": 0, "idle_under_5m": 0, "idle_5_to_30m": 0, "idle_over_30m": 453
    }
    split.charge(material, 640 - 64, 40, idle_s=299.0)
    split.charge(material, 640 - 64, 40)
    assert split.capacity_by_idle == {
        "first_request": 453, "idle_under_5m": 453, "idle_5_to_30m": 0, "idle_over_30m": 453
    }


def test_a_request_is_not_charged_against_its_own_snapshots(tmp_path):
    """The simulator prefills inside the admission, so a request publishes its taps before it is charged;
    a tap of its own at its divergence point is no snapshot that "once stood nearer"."""
    trace = load_trace(write_weka(tmp_path / "one.json", [weka_request(0.0, 640, 4, list(range(1, 11)))]))
    material = build_material(trace.conversations[0].requests[0], None, False, 0)
    split = ExcessSplit()
    split.admitting()
    split.published(int(material.block_hashes[8]), ())  # its own tap at 576, inside (64, 600]
    split.charge(material, 640 - 64, 40)
    assert (split.capacity_tokens, split.placement_tokens) == (0, 536)
    # Once charged, the tap counts for the requests after it: the same prompt again lost 512 to eviction.
    split.charge(material, 640 - 64, 40)
    assert (split.capacity_tokens, split.placement_tokens) == (512, 536 + 24)
    # After an admission that blocked (settled, not charged), a snapshot published between admissions (an
    # endpoint at a finish) counts at once: it is not held for a charge that never comes.
    blocked = ExcessSplit()
    blocked.admitting()
    blocked.settle()
    blocked.published(int(material.block_hashes[8]), ())
    blocked.charge(material, 640 - 64, 40)
    assert (blocked.capacity_tokens, blocked.placement_tokens) == (512, 24)


def test_the_hedge_budget_keeps_hedges_off_the_host(tmp_path):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    _, free = run(trace, config(hedge_budget=1 << 40))
    sim, none = run(trace, config(hedge_budget=0))
    assert free.counters.hedges_taken > 0 and free.counters.hedge_host_bytes_peak > 0
    assert none.counters.hedge_host_bytes_peak == 0
    assert none.counters.hedge_writes_refused >= 1
    assert_accounting_adds_up(none, trace)
    check_integrity(sim.driver.cache.index)


def test_a_cold_prompt_is_hedged_only_where_hedges_have_a_host_budget(tmp_path):
    """The simulator plans as the worker does: ``hedge_cold_prompts`` follows the resolved budget."""
    cold = write_weka(tmp_path / "cold.json", [weka_request(0.0, 1300, 10, list(range(1, 21)))])
    trace = load_trace([cold], shared_prefix=True)
    budgeted, hedged = run(trace, config(hedge_budget=1 << 20, users=1))
    unbudgeted, plain = run(trace, config(hedge_budget=0, users=1))
    assert budgeted.driver.tap_options.hedge_cold_prompts
    assert not unbudgeted.driver.tap_options.hedge_cold_prompts
    assert hedged.counters.hedges_taken > 0  # the last block boundary 1280, n-256, n-512, n-1024
    assert plain.counters.hedges_taken == 0  # only the tail (no ladder this short)
    check_integrity(budgeted.driver.cache.index)


# --- model shapes ----------------------------------------------------------------------------------------

def test_model_shapes_match_the_spec():
    big = get_shape("qwen3.5-27b-int8")
    assert big.page_bytes == 2_162_688  # 2.06 MiB per 64 tokens (spec §3.1)
    # §3.2's 186.8 MiB less 40 MiB of DFlash2, plus 48 pending tails of 63 x 5120 bf16 rows
    assert abs(big.image_bytes / 2**20 - 176.4) < 0.1
    assert get_shape("qwen3.5-35b-a3b-int8").page_bytes == 675_840  # 0.64 MiB
    assert {"tiny", "small"} <= set(SHAPES)
    with pytest.raises(ValueError, match="unknown model shape"):
        get_shape("nope")


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_a_preset_shape_sizes_its_image_as_the_state_slots_do(name):
    # pending tail included: simulated host capacity must match a live server's
    preset = get_preset(name)
    conv_dim = (
        2 * preset.linear_num_key_heads * preset.linear_key_head_dim
        + preset.linear_num_value_heads * preset.linear_value_head_dim
    )
    shape = StateShape(
        conv_dim,
        preset.linear_conv_kernel_dim - 1,
        preset.linear_num_value_heads,
        preset.linear_key_head_dim,
        preset.linear_value_head_dim,
        preset.hidden_size,
    )
    linear = [i for i, kind in enumerate(preset.layer_types) if kind != "full_attention"]
    dtype = getattr(torch, preset.default_dtype)
    assert get_shape(name).image_bytes == StateSlots(linear, 1, shape, dtype).image_bytes


# --- the CLI ---------------------------------------------------------------------------------------------

REQUIRED = ("requests", "input_tokens", "computed_tokens", "reused_tokens_device_kv",
            "reused_tokens_host_kv", "restored_kv_bytes", "restored_state_bytes", "evicted_device_blocks",
            "evicted_host_blocks", "bound_tokens", "computed_vs_bound", "assume_echo")


def test_cli_prints_one_name_value_per_line(tmp_path, capsys):
    paths = [str(p) for p in story_traces(tmp_path)]
    assert simulate_cli.main([*paths, "--model-shape", "tiny", "--host-cache-mib", "64", "--users", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert all(re.fullmatch(r"[a-z_0-9]+=.*", line) for line in lines)
    values = dict(line.split("=", 1) for line in lines)
    assert set(REQUIRED) <= set(values)
    assert values["requests"] == "7" and values["assume_echo"] == "true"
    assert values["hedge_budget"] == "auto"
    assert {"excess_capacity_tokens", "excess_placement_tokens", "hedge_writes_refused"} <= set(values)


def test_cli_takes_a_hedge_budget(tmp_path, capsys):
    paths = [str(p) for p in story_traces(tmp_path)]
    assert simulate_cli.main([*paths, "--model-shape", "tiny", "--hedge-budget", "0"]) == 0
    values = dict(line.split("=", 1) for line in capsys.readouterr().out.strip().splitlines())
    assert values["hedge_budget"] == "0" and values["hedge_host_bytes_peak"] == "0"
    with pytest.raises(SystemExit):
        simulate_cli.main([*paths, "--hedge-budget", "lots"])


def test_cli_sweep_prints_a_table_and_draws_a_png(tmp_path, capsys):
    paths = [str(p) for p in story_traces(tmp_path)]
    out = tmp_path / "sweep.png"
    code = simulate_cli.main([*paths, "--model-shape", "tiny", "--sweep", "0,64", "--plot", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[:3] == ["policy", "host_cache_mib", "computed_tokens"]
    assert len([line for line in text.splitlines() if line.strip().startswith(("ours", "lru", "align"))]) == 6
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_a_bad_trace(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert simulate_cli.main([str(bad)]) == 2
    assert "simulate:" in capsys.readouterr().err


# --- the oracle reference (issue 19) ---------------------------------------------------------------------

def test_future_uses_name_the_next_request_not_yet_admitted():
    future = FutureUses([("a", [1, 2]), ("b", [1, 3]), ("c", [2]), ("d", [1])])
    assert [future.next_use(h) for h in (1, 2, 3, 4)] == [0, 0, 1, NEVER]
    future.admitted("a")
    assert [future.next_use(h) for h in (1, 2, 3)] == [1, 2, 1]
    future.admitted("d")  # out of order: "b" still comes first for block 1
    future.admitted("c")
    assert [future.next_use(h) for h in (1, 2)] == [1, NEVER]
    assert future.position == 3


def test_a_snapshot_is_needed_by_the_next_request_that_does_not_reach_a_deeper_one():
    # block hashes by depth: 1 -> 2 -> 3 (a conversation), 1 -> 9 (an edit after the first block)
    future = FutureUses([("a", [1, 2, 3]), ("b", [1, 2, 3]), ("c", [1, 9]), ("d", [1, 2])])
    deeper = [(1, 2)]  # a snapshot anchored at depth 1 (hash 2) lies below one anchored at hash 1
    assert future.next_use(1) == 0
    assert future.next_use(1, deeper) == 2  # a and b resume from the deeper snapshot
    assert future.next_use(2, [(2, 3)]) == 3  # only d stops between hash 2 and hash 3
    future.arriving("a")  # a snapshot "a" publishes serves the next request, not "a" itself
    assert future.next_use(1, after_arriving=True) == 1
    assert future.next_use(1) == 0
    future.admitted("a")
    future.admitted("c")
    assert future.next_use(1, deeper) == NEVER  # "d" holds hash 2 as well
    assert future.next_use(2, [(2, 3)]) == 3


def test_cli_sweep_users_prints_every_policy_per_concurrency(tmp_path, capsys):
    paths = [str(p) for p in story_traces(tmp_path)]
    code = simulate_cli.main([*paths, "--model-shape", "tiny", "--host-cache-mib", "1",
                              "--device-pages", "40", "--sweep-users", "1,2"])
    assert code == 0
    header, *rows = capsys.readouterr().out.strip().splitlines()
    columns = header.split()
    assert columns[:6] == ["users", "bound_tokens", "ours", "oracle", "align", "lru"]
    assert [row.split()[0] for row in rows] == ["1", "2"]
    for row in rows:
        _, bound, ours, oracle, align, lru, *_, ours_vs_oracle, closed = row.split()
        cells = dict(zip(columns, row.split(), strict=True))
        floor = int(cells["floor"])  # ours over its capacity floor, the floor over the bound
        assert int(bound) <= floor <= int(ours)
        assert float(cells["ours_vs_floor"]) == pytest.approx(int(ours) / floor, abs=1e-4)
        assert float(cells["floor_vs_bound"]) == pytest.approx(floor / int(bound), abs=1e-4)
        assert int(bound) <= min(int(ours), int(oracle), int(align), int(lru))
        assert float(ours_vs_oracle) == pytest.approx(int(ours) / int(oracle), abs=1e-4)
        if int(align) != int(bound):
            expected = (int(align) - int(ours)) / (int(align) - int(bound))
            assert float(closed) == pytest.approx(expected, abs=1e-3)


@pytest.mark.parametrize(("host_mib", "pages", "users"), [(1, 40, 1), (1, 40, 2), (2, 60, 2), (0, 60, 2)])
def test_the_oracle_never_computes_more_than_ours(tmp_path, host_mib, pages, users):
    trace = load_trace(story_traces(tmp_path), shared_prefix=True)
    cfg = config(host_cache_mib=host_mib, device_pages=pages, users=users)
    ours, oracle = simulate_with_oracle(trace, cfg)
    assert oracle.bound_tokens == ours.bound_tokens
    assert ours.bound_tokens <= oracle.counters.computed_tokens <= ours.counters.computed_tokens
