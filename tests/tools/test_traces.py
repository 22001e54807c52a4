"""Trace readers: WEKA (sub-agents, tails, namespaces, shared prefix), Mooncake, our JSONL; expansion."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.tools.traces import (
    Trace,
    TraceFormatError,
    TraceRequest,
    expand_token_array,
    expand_tokens,
    load_trace,
)

FIXTURES = Path(__file__).parent / "fixtures"
ALPHA = FIXTURES / "weka_alpha.json"
BETA = FIXTURES / "weka_beta.json"
MOONCAKE = FIXTURES / "mooncake_small.jsonl"
OURS = FIXTURES / "ours_blocks.jsonl"
SHARED_TRACES = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
VOCAB = 1000


# --- helpers ---------------------------------------------------------------------------------------------

def conversation_requests(trace: Trace, conversation_id: str) -> tuple[TraceRequest, ...]:
    return next(c for c in trace.conversations if c.id == conversation_id).requests


def ids(request: TraceRequest) -> list[int]:
    return request.block_ids.tolist()


def all_ids_except(trace: Trace, excluded: TraceRequest) -> set[int]:
    return {i for r in trace.requests() if r is not excluded for i in ids(r)}


def assert_block_counts_cover_inputs(trace: Trace) -> None:
    for request in trace.requests():
        assert len(request.block_ids) == -(-request.input_tokens // request.block_size), request
        assert not request.block_ids.flags.writeable


def write_lines(path: Path, objects: list[dict]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


# --- WEKA ------------------------------------------------------------------------------------------------

def test_weka_file_becomes_a_root_and_its_subagent_with_times_and_counts():
    trace = load_trace(ALPHA)
    assert (trace.format, trace.block_size, trace.clock) == ("weka", 64, "conversation")
    root, child = trace.conversations
    assert (root.id, root.parent, len(root.requests)) == ("alpha", None, 4)
    assert (child.id, child.parent, child.start_s) == ("alpha/agent_001", "alpha", 15.0)
    assert [r.arrival_s for r in root.requests] == [0.0, 10.0, 30.0, 40.0]
    assert [r.arrival_s for r in child.requests] == [15.0, 20.0]
    assert [r.turn for r in child.requests] == [0, 1]
    first = root.requests[0]
    assert (first.input_tokens, first.output_tokens, first.api_s, first.think_s) == (200, 30, 1.5, 0.0)
    assert root.requests[1].think_s == 7.5
    assert root.requests[2].api_s == 0.0  # absent in the file
    assert trace.children("alpha") == (child,)
    assert trace.roots() == (root,)
    assert_block_counts_cover_inputs(trace)


def test_weka_partial_last_block_borrows_the_id_the_next_request_extends_with():
    r0, r1, _, _ = conversation_requests(load_trace(ALPHA), "alpha")
    assert r0.tail_tokens == 8 and r0.full_blocks == 3
    assert ids(r0) == ids(r1)[:4]  # tail id = r1's 4th block: r1 continues r0's prompt
    tokens_r0 = expand_tokens(r0, VOCAB)
    assert tokens_r0 == expand_tokens(r1, VOCAB)[:200]


def test_weka_tail_without_an_extending_successor_is_private():
    trace = load_trace(ALPHA)
    root = conversation_requests(trace, "alpha")
    for request in (root[1], root[3], conversation_requests(trace, "alpha/agent_001")[1]):
        assert request.tail_tokens > 0
        assert ids(request)[-1] not in all_ids_except(trace, request)


def test_weka_local_ids_are_shared_within_a_file_and_disjoint_across_files():
    trace = load_trace([ALPHA, BETA])
    alpha, beta = conversation_requests(trace, "alpha"), conversation_requests(trace, "beta")
    assert ids(alpha[2])[0] == ids(alpha[0])[0]  # same local id 1 in one file
    assert not set(ids(alpha[0])) & set(ids(beta[0]))  # the same local ids in another file
    assert [c.shared_prefix_blocks for c in trace.conversations] == [0, 0, 0, 0]


def test_weka_shared_prefix_makes_leading_blocks_common_to_all_conversations():
    trace = load_trace([ALPHA, BETA], shared_prefix=True)
    alpha, beta = conversation_requests(trace, "alpha"), conversation_requests(trace, "beta")
    assert ids(alpha[0])[:2] == ids(beta[0])[:2]  # alpha: (100 + 60) // 64 = 2 blocks
    assert ids(alpha[0])[2] != ids(beta[0])[2]  # beta's third prefix block is beyond alpha's prefix
    assert ids(alpha[3])[0] == ids(beta[0])[0]  # the id is replaced wherever it appears
    explore_alpha = conversation_requests(trace, "alpha/agent_001")[0]
    explore_beta = conversation_requests(trace, "beta/agent_001")[0]
    assert ids(explore_alpha)[0] == ids(explore_beta)[0]  # one common prefix per subagent_type
    assert ids(explore_alpha)[1] != ids(explore_beta)[1]
    assert ids(explore_alpha)[0] != ids(alpha[0])[0]
    assert [c.shared_prefix_blocks for c in trace.conversations] == [2, 1, 3, 1]
    tokens = [expand_tokens(r, VOCAB) for r in (alpha[0], beta[0])]
    assert tokens[0][:128] == tokens[1][:128]
    assert tokens[0][128:192] != tokens[1][128:192]


def test_a_prefix_id_of_the_root_keeps_its_common_id_when_a_subagent_starts_with_it(tmp_path: Path):
    data = json.loads(BETA.read_text())
    data["requests"][1]["requests"][0]["hash_ids"] = [1, 31, 32]
    path = tmp_path / "gamma.json"
    path.write_text(json.dumps(data))
    trace = load_trace([ALPHA, path], shared_prefix=True)
    assert ids(conversation_requests(trace, "beta/agent_001")[0])[0] == ids(
        conversation_requests(trace, "alpha")[0])[0]


@pytest.mark.parametrize(("change", "message"), [
    ({"hash_ids": [1, 2]}, "2 hash ids for 200 tokens"),
    ({"type": "x"}, "unknown request type 'x'"),
])
def test_weka_inconsistent_requests_name_the_file(tmp_path: Path, change: dict, message: str):
    data = json.loads(ALPHA.read_text())
    data["requests"][0].update(change)
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match=message) as caught:
        load_trace(path)
    assert caught.value.path == str(path)


def test_weka_global_scope_is_refused(tmp_path: Path):
    data = json.loads(ALPHA.read_text()) | {"hash_id_scope": "global"}
    path = tmp_path / "global.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TraceFormatError, match="hash_id_scope"):
        load_trace(path)


# --- Mooncake --------------------------------------------------------------------------------------------

def test_mooncake_lines_are_single_request_conversations_on_a_global_clock():
    trace = load_trace(MOONCAKE)
    assert (trace.format, trace.block_size, trace.clock) == ("mooncake", 512, "global")
    assert [c.id for c in trace.conversations] == ["mooncake_small#1", "mooncake_small#2", "mooncake_small#4"]
    assert [r.arrival_s for r in trace.requests()] == [0.0, 0.25, 1.5]
    assert [r.output_tokens for r in trace.requests()] == [20, 7, 3]
    assert_block_counts_cover_inputs(trace)


def test_mooncake_global_ids_share_blocks_and_partial_blocks_are_prefixes():
    first, second, third = load_trace(MOONCAKE).requests()
    assert ids(first)[0] == ids(second)[0] == ids(third)[0]
    assert ids(first)[1] != ids(second)[1]
    assert (first.full_blocks, first.tail_tokens) == (1, 1000 - 512)
    shared = expand_tokens(first, VOCAB)[:512]
    assert shared == expand_tokens(second, VOCAB)[:512] == expand_tokens(third, VOCAB)
    assert len(expand_tokens(second, VOCAB)) == 1100


def test_two_mooncake_files_never_share_ids_by_accident(tmp_path: Path):
    copy = tmp_path / "other.jsonl"
    shutil.copy(MOONCAKE, copy)
    trace = load_trace([MOONCAKE, copy])
    halves = list(trace.requests())
    assert not {i for r in halves[:3] for i in ids(r)} & {i for r in halves[3:] for i in ids(r)}


def test_mooncake_wrong_id_count_names_the_line(tmp_path: Path):
    path = write_lines(tmp_path / "bad.jsonl", [
        {"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": [0]},
    ])
    with pytest.raises(TraceFormatError, match="line 2: 1 hash ids for 600"):
        load_trace(path)


# --- our JSONL (block form; the text form is tested with the generator) -----------------------------------

def test_our_jsonl_block_form_reads_conversations_parents_and_think_times():
    trace = load_trace(OURS)
    assert (trace.format, trace.clock) == ("jsonl", "global")
    assert [c.id for c in trace.conversations] == ["c1", "c2", "c1/sub"]
    c1 = conversation_requests(trace, "c1")
    assert [(r.turn, r.arrival_s, r.output_tokens) for r in c1] == [(0, 0.0, 16), (1, 3.0, 16)]
    assert c1[1].think_s == 1.25
    assert ids(c1[1]) == [7, 8, 9, 10]
    assert trace.children("c1")[0].parent == "c1"
    assert ids(conversation_requests(trace, "c2")[0]) == [7]  # global ids: the first block is shared
    assert_block_counts_cover_inputs(trace)


@pytest.mark.parametrize(("line", "message"), [
    ({"conversation": "a", "turn": 1, "arrival_s": 0, "max_tokens": 1, "input_tokens": 1, "block_ids": [1]},
     "turn 1, expected 0"),
    ({"conversation": "a", "turn": 0, "arrival_s": 0, "max_tokens": 1, "input_tokens": 65, "block_ids": [1]},
     "1 block ids for 65 tokens"),
    ({"conversation": "a", "turn": 0, "arrival_s": 0, "max_tokens": 1}, "needs messages"),
    ({"conversation": "a", "turn": "zero", "arrival_s": 0, "max_tokens": 1}, "line 1"),
])
def test_our_jsonl_errors_name_the_line(tmp_path: Path, line: dict, message: str):
    with pytest.raises(TraceFormatError, match=message):
        load_trace(write_lines(tmp_path / "bad.jsonl", [line]))


# --- loading and detection -------------------------------------------------------------------------------

def test_a_directory_loads_its_trace_files_in_name_order_and_skips_others(tmp_path: Path):
    shutil.copy(BETA, tmp_path / "b.json")
    shutil.copy(ALPHA, tmp_path / "a.json")
    (tmp_path / "LICENSE").write_text("Apache-2.0")
    trace = load_trace(tmp_path)
    assert [c.id for c in trace.roots()] == ["alpha", "beta"]


def test_mixed_formats_unknown_files_and_missing_paths_are_refused(tmp_path: Path):
    with pytest.raises(TraceFormatError, match="mixed"):
        load_trace([ALPHA, MOONCAKE])
    unknown = write_lines(tmp_path / "unknown.jsonl", [{"hello": 1}])
    with pytest.raises(TraceFormatError, match="unrecognized"):
        load_trace(unknown)
    (tmp_path / "garbage.json").write_text("not json at all")
    with pytest.raises(TraceFormatError, match="not a trace"):
        load_trace(tmp_path / "garbage.json")
    with pytest.raises(TraceFormatError, match="no such file"):
        load_trace(tmp_path / "absent.json")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceFormatError, match="no trace files"):
        load_trace(empty)


# --- token expansion -------------------------------------------------------------------------------------

def test_expansion_is_exact_in_length_and_range_and_pinned_in_value():
    request = next(load_trace(OURS).requests())
    tokens = expand_tokens(request, 50, low=10)
    assert len(tokens) == 100
    assert all(10 <= t < 50 for t in tokens)
    assert expand_tokens(request, 50, low=10) == tokens


def test_pinned_expansion_values_do_not_drift():
    # Replays depend on these exact values: changing the hash silently changes every expanded trace.
    assert expand_token_array(np.array([0]), 4, 4, 1 << 20).tolist() == [904623, 154817, 480974, 102381]


def test_same_id_same_tokens_and_salt_changes_them():
    a = expand_token_array(np.array([5, 6]), 64, 128, VOCAB)
    b = expand_token_array(np.array([9, 5]), 64, 128, VOCAB)
    assert a[:64].tolist() == b[64:].tolist()
    assert a[64:].tolist() != b[:64].tolist()
    salted = expand_token_array(np.array([5, 6]), 64, 128, VOCAB, salt=1)
    assert salted.tolist() != a.tolist()


def test_expansion_rejects_empty_ranges_and_short_blocks():
    with pytest.raises(ValueError, match="vocab_size"):
        expand_token_array(np.array([1]), 64, 10, 5, low=5)
    with pytest.raises(ValueError, match="length"):
        expand_token_array(np.array([1]), 64, 65, VOCAB)


@given(block_ids=st.lists(st.integers(0, 2**62), min_size=1, max_size=6),
       short=st.integers(0, 64 * 6), long=st.integers(0, 64 * 6))
@settings(max_examples=60, deadline=None)
def test_a_shorter_expansion_is_a_prefix_of_a_longer_one(block_ids: list[int], short: int, long: int):
    short, long = sorted((min(short, 64 * len(block_ids)), min(long, 64 * len(block_ids))))
    ids_array = np.array(block_ids, dtype=np.int64)
    longer = expand_token_array(ids_array, 64, long, VOCAB)
    assert len(longer) == long
    assert expand_token_array(ids_array, 64, short, VOCAB).tolist() == longer[:short].tolist()


# --- a real trace file, read only ------------------------------------------------------------------------

@pytest.mark.skipif(not (SHARED_TRACES / "weka-claude-code" / "trace_0001.json").exists(),
                    reason="the shared traces folder (../shared/traces) is not present in this checkout")
def test_a_real_weka_file_reads_consistently_with_its_own_totals():
    path = SHARED_TRACES / "weka-claude-code" / "trace_0001.json"
    totals = json.loads(path.read_text())["totals"]
    trace = load_trace(path, shared_prefix=True)
    assert_block_counts_cover_inputs(trace)
    root_inputs = sum(r.input_tokens for c in trace.roots() for r in c.requests)
    assert root_inputs == totals["parent_tokens"]["input"]
    assert trace.roots()[0].shared_prefix_blocks == (12974 + 4243) // 64
    arrivals = [r.arrival_s for r in trace.roots()[0].requests]
    assert arrivals == sorted(arrivals)
