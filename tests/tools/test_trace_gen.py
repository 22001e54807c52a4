"""The trace generator: same bytes from the same seed, each kind's shape, and our reader's round trip."""

from __future__ import annotations

import argparse
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest

from hybridcache.tools import trace_gen
from hybridcache.tools.traces import TraceLine, load_trace
from hybridcache.tools.traces.synth import BURST_COPIES, approx_tokens

SCALE = 0.02  # agent prompts of ~600-2000 tokens instead of 30k-100k


# --- helpers ---------------------------------------------------------------------------------------------

def lines_of(kind: str, seed: int = 3, scale: float = SCALE) -> list[TraceLine]:
    return trace_gen.generate(kind, seed, scale)


def by_conversation(lines: list[TraceLine]) -> dict[str, list[TraceLine]]:
    runs: dict[str, list[TraceLine]] = defaultdict(list)
    for line in lines:
        runs[line.conversation].append(line)
    return runs


def cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    trace_gen.add_arguments(parser)
    return parser.parse_args(list(argv))


def assert_history_extends(earlier: TraceLine, later: TraceLine) -> None:
    assert later.messages[: len(earlier.messages)] == earlier.messages


def assert_no_reasoning_in_history(lines: list[TraceLine]) -> None:
    for line in lines:
        for message in line.messages:
            assert "reasoning_content" not in message
            assert "<think>" not in (message.get("content") or "")


# --- determinism -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", trace_gen.KINDS)
def test_every_kind_is_reproducible_from_its_seed(kind: str):
    first = trace_gen.render(lines_of(kind, seed=11))
    assert first == trace_gen.render(lines_of(kind, seed=11))
    assert first != trace_gen.render(lines_of(kind, seed=12))


def test_the_command_writes_the_same_bytes_as_the_library(tmp_path: Path, capsys: pytest.CaptureFixture):
    out = tmp_path / "mixed.jsonl"
    assert trace_gen.run(cli("--kind", "mixed", "--seed", "5", "--scale", str(SCALE), "--out", str(out))) == 0
    assert out.read_bytes() == trace_gen.render(lines_of("mixed", seed=5))
    assert "requests=" in capsys.readouterr().err


def test_the_command_rejects_a_bad_scale(capsys: pytest.CaptureFixture):
    assert trace_gen.run(cli("--kind", "chat", "--scale", "0")) == 2
    assert "scale" in capsys.readouterr().err


def test_unknown_kinds_are_refused():
    with pytest.raises(ValueError, match="kind"):
        trace_gen.generate("poetry", 1)


# --- each kind's shape -----------------------------------------------------------------------------------

def test_lines_are_in_arrival_order_with_consecutive_turns():
    for kind in trace_gen.KINDS:
        lines = lines_of(kind)
        assert [line.arrival_s for line in lines] == sorted(line.arrival_s for line in lines)
        for run in by_conversation(lines).values():
            assert [line.turn for line in run] == list(range(len(run)))


def test_chat_turns_extend_their_history_without_reasoning():
    runs = by_conversation(lines_of("chat"))
    assert len(runs) == 4
    for run in runs.values():
        assert 3 <= len(run) <= 8
        for earlier, later in pairwise(run):
            assert_history_extends(earlier, later)
            assert later.messages[len(earlier.messages)]["role"] == "assistant"
            assert later.arrival_s > earlier.arrival_s
        assert_no_reasoning_in_history(run)


def test_agent_loops_grow_to_the_scaled_target_with_matching_tool_results():
    runs = by_conversation(lines_of("agent"))
    assert len(runs) == 2
    for run in runs.values():
        final = run[-1]
        assert 30_000 * SCALE <= approx_tokens(final.messages) <= 100_000 * SCALE + 4000 * SCALE + 200
        assert final.tools and {t["function"]["name"] for t in final.tools} >= {"read_file"}
        calls = [m for m in final.messages if m["role"] == "assistant"]
        results = [m for m in final.messages if m["role"] == "tool"]
        assert [c["tool_calls"][0]["id"] for c in calls] == [r["tool_call_id"] for r in results]
        for earlier, later in pairwise(run):
            assert_history_extends(earlier, later)
            assert later.messages[-1]["role"] == "tool"


def test_full_size_agent_prompts_reach_thirty_to_a_hundred_thousand_tokens():
    final = by_conversation(lines_of("agent", scale=1.0))
    sizes = [approx_tokens(run[-1].messages) for run in final.values()]
    assert all(30_000 <= size <= 104_000 for size in sizes), sizes


@pytest.mark.parametrize("seed", [3, 4, 5, 6])
def test_subagent_branches_share_the_exact_preamble_and_alternate(seed: int):
    lines = lines_of("subagents", seed=seed)
    lead = [line for line in lines if line.parent is None]
    branches = by_conversation([line for line in lines if line.parent is not None])
    assert len(lead) == 1
    assert 4 <= len(branches) <= 16
    preamble = lead[0].messages[0]
    assert all(line.messages[0] == preamble for run in branches.values() for line in run)
    assert all(line.parent == lead[0].conversation for run in branches.values() for line in run)
    first_round = [line.conversation for line in lines if line.parent and line.turn == 0]
    second_round = [line.conversation for line in lines if line.parent and line.turn == 1]
    assert first_round == second_round  # the same rotation each round
    assert max(line.arrival_s for line in lines if line.turn == 0) < min(
        line.arrival_s for line in lines if line.turn == 1)


def test_full_size_subagent_preamble_is_ten_to_thirty_thousand_tokens():
    lead = next(line for line in lines_of("subagents", scale=1.0) if line.parent is None)
    assert 10_000 <= approx_tokens(lead.messages[:1]) <= 31_000


def test_an_edit_changes_exactly_one_deep_user_message_then_continues():
    for run in by_conversation(lines_of("edits")).values():
        before, edited, after = run[-3], run[-2], run[-1]
        assert len(edited.messages) == len(before.messages)
        changed = [i for i, (a, b) in enumerate(zip(before.messages, edited.messages)) if a != b]
        assert len(changed) == 1
        assert changed[0] < len(before.messages) // 2
        assert edited.messages[changed[0]]["role"] == "user"
        assert_history_extends(edited, after)
        assert 6 <= len(run) - 2 <= 10


def test_a_burst_is_eight_identical_prompts_at_one_moment():
    lines = lines_of("burst")
    assert len(lines) == BURST_COPIES == 8
    assert len({line.conversation for line in lines}) == 8
    assert all(line.messages == lines[0].messages for line in lines)
    assert len({line.arrival_s for line in lines}) == 1


def test_mixed_holds_every_kind_and_unique_one_shot_documents():
    lines = lines_of("mixed")
    assert {line.kind for line in lines} == {"chat", "agent", "subagents", "edits", "burst", "document"}
    documents = [line for line in lines if line.kind == "document"]
    assert len(documents) == 3
    assert len({line.messages[0]["content"] for line in documents}) == 3
    starts = sorted({run[0].arrival_s for run in by_conversation(lines).values() if run[0].parent is None})
    assert len(starts) >= 8  # Poisson starts: units do not all arrive together


# --- the reader round trip -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", trace_gen.KINDS)
def test_our_reader_round_trips_generated_lines(tmp_path: Path, kind: str):
    lines = lines_of(kind)
    path = tmp_path / f"{kind}.jsonl"
    path.write_bytes(trace_gen.render(lines))
    trace = load_trace(path)
    assert trace.format == "jsonl"
    read = sorted(trace.requests(), key=lambda r: (r.arrival_s, r.conversation, r.turn))
    assert [(r.conversation, r.turn, r.arrival_s, r.output_tokens, r.parent) for r in read] == [
        (line.conversation, line.turn, line.arrival_s, line.max_tokens, line.parent) for line in lines]
    assert [list(r.messages) for r in read] == [line.messages for line in lines]
    assert [None if r.tools is None else list(r.tools) for r in read] == [line.tools for line in lines]


def test_text_block_ids_follow_shared_message_prefixes(tmp_path: Path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(trace_gen.render(lines_of("mixed")))
    trace = load_trace(path)
    for conversation in trace.conversations:
        for earlier, later in pairwise(conversation.requests):
            if later.messages[: len(earlier.messages)] == earlier.messages:
                full = earlier.full_blocks
                assert later.block_ids[:full].tolist() == earlier.block_ids[:full].tolist()
    bursts = [r for r in trace.requests() if r.conversation.startswith("burst")]
    assert len({tuple(r.block_ids.tolist()) for r in bursts}) == 1
    documents = [r for r in trace.requests() if r.conversation.startswith("document")]
    assert len({r.block_ids[0] for r in documents}) == 3
