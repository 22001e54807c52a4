"""`hybridcache bench trace`: which requests a replay sends and how, what the client records against a
live server on the micro checkpoint (TTFT, cached tokens), what is printed and drawn, and the clear
errors for a missing trace, a bad format and an unreachable server. Speed is not asserted: the printed
ratios are the measurement."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cli import main
from hybridcache.tools.bench_trace import _describe_late
from hybridcache.tools.serve_launch import ServeFlags, ServeLaunchError, ServeProcess
from hybridcache.tools.trace_bound import LateResume
from hybridcache.tools.trace_client import RequestRecord, make_client, probe_server, send_request
from hybridcache.tools.trace_gen import generate, render
from hybridcache.tools.trace_plan import PlanLimits, PlannedRequest, plan_replay, select_requests
from hybridcache.tools.trace_report import (
    compare,
    plot_ttft_per_turn,
    summarize_server,
    ttft_by_request,
    ttft_by_turn,
)
from hybridcache.tools.traces import Conversation, Trace, TraceRequest, load_trace

FIXTURES = Path(__file__).parent / "fixtures"
WEKA = FIXTURES / "weka_alpha.json"
MOONCAKE = FIXTURES / "mooncake_small.jsonl"
TOKEN_RANGE = (0, 256)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LIMITS = PlanLimits(max_requests=None, max_prompt_tokens=4096, max_output_tokens=32)


# --- factories and assertion helpers ---------------------------------------------------------------------

def chat_trace_file(directory: Path, seed: int = 3) -> Path:
    """A small trace-gen chat trace (4 conversations of a few turns)."""
    path = directory / f"chat-{seed}.jsonl"
    path.write_bytes(render(generate("chat", seed, scale=0.02)))
    return path


def record(turn: int, ttft_s: float, prompt: int = 100, cached: int = 0, error: str = "",
           conversation: str = "c") -> RequestRecord:
    return RequestRecord(conversation=conversation, turn=turn, sent_s=0.0, ttft_s=ttft_s, total_s=ttft_s + 1,
                         prompt_tokens=prompt, cached_tokens=cached, completion_tokens=4, error=error)


def block_request(conversation: str, turn: int, arrival_s: float, tokens: int = 64) -> TraceRequest:
    ids = np.arange(-(-tokens // 64), dtype=np.int64)
    ids.setflags(write=False)
    return TraceRequest(conversation=conversation, parent=None, turn=turn, arrival_s=arrival_s,
                        input_tokens=tokens, output_tokens=8, block_ids=ids, block_size=64)


def trace_of(arrivals: dict[str, list[float]], clock: str = "global") -> Trace:
    """Conversations (in dict order) whose turns arrive at the given times."""
    conversations = tuple(
        Conversation(id=name, parent=None, start_s=times[0],
                     requests=tuple(block_request(name, turn, t) for turn, t in enumerate(times)))
        for name, times in arrivals.items())
    return Trace(name="made", format="jsonl", block_size=64, clock=clock, conversations=conversations)


def run_cli(*argv: str) -> tuple[int, dict[str, str], str]:
    """`hybridcache bench trace ...`: (exit status, the name=value lines, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["bench", "trace", *argv])
    lines = dict(line.split("=", 1) for line in out.getvalue().splitlines() if "=" in line and
                 not line.startswith("note="))
    return status, lines, err.getvalue()


def assert_ratio(lines: dict[str, str], ratio: str, numerator: str, denominator: str) -> None:
    expected = float(lines[numerator]) / float(lines[denominator])
    assert float(lines[ratio]) == pytest.approx(expected, rel=0.01), (ratio, lines[ratio], expected)


def assert_percentiles_ordered(lines: dict[str, str], label: str) -> None:
    p50, p90, p99 = (float(lines[f"{label}.ttft_p{q}_s"]) for q in (50, 90, 99))
    assert 0 < p50 <= p90 <= p99, (label, p50, p90, p99)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- what a replay sends -----------------------------------------------------------------------------------

def test_max_requests_keeps_the_earliest_requests_and_every_earlier_turn():
    trace = trace_of({"a": [0.0, 5.0, 9.0], "b": [1.0, 2.0, 3.0]})
    chosen = select_requests(trace, 4)
    assert [(r.conversation, r.turn) for r in chosen] == [("a", 0), ("b", 0), ("b", 1), ("b", 2)]


def test_on_a_per_conversation_clock_roots_are_taken_one_after_the_other():
    trace = trace_of({"a": [0.0, 5.0, 9.0], "b": [0.0, 1.0]}, clock="conversation")
    chosen = select_requests(trace, 4)
    assert [(r.conversation, r.turn) for r in chosen] == [("a", 0), ("a", 1), ("a", 2), ("b", 0)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(0, 100), min_size=1, max_size=5), min_size=1, max_size=5),
       st.integers(1, 30), st.sampled_from(["global", "conversation"]))
def test_a_selection_is_always_a_prefix_of_every_conversation(arrivals, limit, clock):
    trace = trace_of({f"c{i}": times for i, times in enumerate(arrivals)}, clock=clock)
    chosen = select_requests(trace, limit)
    assert len(chosen) == min(limit, trace.num_requests)
    for conversation in trace.conversations:
        turns = [r.turn for r in chosen if r.conversation == conversation.id]
        assert turns == list(range(len(turns))), (conversation.id, turns)


def test_block_id_prompts_are_deterministic_capped_and_share_the_traces_prefixes():
    trace = load_trace(MOONCAKE)
    limits = LIMITS._replace(max_prompt_tokens=600, max_output_tokens=10)
    plan = plan_replay(trace, limits, TOKEN_RANGE)
    again = plan_replay(trace, limits, TOKEN_RANGE)
    first, second, third = (c.requests[0] for c in plan.conversations)
    assert plan.endpoint == "completion" and plan == again
    assert [len(r.prompt_token_ids) for r in (first, second, third)] == [600, 600, 512]
    assert all(TOKEN_RANGE[0] <= t < TOKEN_RANGE[1] for t in first.prompt_token_ids)
    assert first.prompt_token_ids[:512] == second.prompt_token_ids[:512] == third.prompt_token_ids  # id 0
    assert first.prompt_token_ids[512:] != second.prompt_token_ids[512:]  # ids 1 and 2 differ
    assert [r.max_tokens for r in (first, second, third)] == [10, 7, 3]
    assert any("capped at their first 600 tokens (2 of 3" in note for note in plan.notes)


def test_message_traces_become_chat_requests_with_their_messages(tmp_path):
    trace = load_trace(chat_trace_file(tmp_path))
    plan = plan_replay(trace, LIMITS._replace(max_requests=5), None)
    assert plan.endpoint == "chat" and plan.num_requests == 5
    request = plan.conversations[0].requests[0]
    original = next(r for r in trace.requests() if r.conversation == request.conversation and r.turn == 0)
    assert request.messages == original.messages and request.prompt_token_ids is None


def test_a_block_id_trace_without_a_token_range_is_refused():
    with pytest.raises(ValueError, match="token range"):
        plan_replay(load_trace(MOONCAKE), LIMITS, None)


# --- what is printed and drawn --------------------------------------------------------------------------

def test_a_summary_has_hand_checked_percentiles_and_token_counts_without_failed_requests():
    records = [record(t, ttft, prompt=100, cached=40 * (t > 0)) for t, ttft in enumerate([5, 1, 4, 2, 3])]
    records.append(record(9, 100.0, prompt=999, error="HTTP 400: too long"))
    summary = summarize_server("cache", records)
    assert summary["cache.requests_ok"] == 5 and summary["cache.errors"] == 1
    assert summary["cache.ttft_p50_s"] == pytest.approx(3.0)
    assert summary["cache.ttft_p90_s"] == pytest.approx(4.6)
    assert summary["cache.ttft_p99_s"] == pytest.approx(4.96)
    assert summary["cache.prompt_tokens"] == 500 and summary["cache.cached_tokens"] == 160
    assert summary["cache.computed_tokens"] == 340
    assert summary["cache.saved_share"] == pytest.approx(0.32)


def test_the_headline_is_the_cached_servers_prefill_and_cache_over_nocache_ratios():
    summary = {**summarize_server("cache", [record(0, 1.0, cached=50)]),
               **summarize_server("nocache", [record(0, 4.0)])}
    headline = compare(summary)
    assert headline["prefill_tokens_computed"] == 50 and headline["prefill_tokens_saved"] == 50
    assert headline["ttft_p50_vs_nocache"] == pytest.approx(0.25)
    assert headline["computed_vs_nocache"] == pytest.approx(0.5)


def test_without_a_nocache_server_there_are_no_ratios():
    headline = compare(summarize_server("cache", [record(0, 1.0, cached=30)]))
    assert headline == {"prefill_tokens_computed": 70, "prefill_tokens_saved": 30}


def test_ttft_per_turn_groups_answered_requests_by_turn():
    records = [record(1, 2.0, conversation="a"), record(0, 1.0), record(1, 3.0, conversation="b"),
               record(2, 9.0, error="failed")]
    assert ttft_by_turn(records) == {0: [1.0], 1: [2.0, 3.0]}


def test_ttft_by_request_numbers_answered_requests_in_send_order():
    late, early = record(0, 2.0, conversation="late"), record(0, 1.0, conversation="early")
    late, early = msgspec.structs.replace(late, sent_s=5.0), msgspec.structs.replace(early, sent_s=1.0)
    assert ttft_by_request([late, record(0, 9.0, error="failed"), early]) == {1: [1.0], 2: [2.0]}


def test_the_plot_is_a_png_file(tmp_path):
    out = tmp_path / "ttft.png"
    runs = {"cache": [record(t, 0.5 + t * 0.1) for t in range(4)],
            "nocache": [record(t, 1.0 + t * 0.5) for t in range(4)] + [record(4, 1.0, error="x")]}
    plot_ttft_per_turn(runs, "TTFT per turn: test", out)
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 10_000


def test_a_one_turn_trace_is_plotted_per_request(tmp_path):
    out = tmp_path / "fan-out.png"
    runs = {label: [record(0, 1.0 + i, conversation=f"branch-{i}") for i in range(5)]
            for label in ("cache", "nocache")}
    plot_ttft_per_turn(runs, "TTFT per request: fan-out", out)
    assert out.read_bytes().startswith(PNG_MAGIC)


# --- clear errors ------------------------------------------------------------------------------------------

def test_a_late_line_names_the_replicas_of_the_request_and_of_its_shared_prompt():
    late = LateResume(("a", 5), prompt_tokens=900, resumed_at=128, diverges_at=800, shared_with=("a", 4),
                      evaluated=772, bound=100)
    plain = "a turn 5: prompt 900, resumed at 128, diverges at 800 from a turn 4; evaluated 772, bound 100"
    assert _describe_late(late, {}) == plain
    assert _describe_late(late, {("a", 5): "r1", ("a", 4): "r0"}) == plain + "; on r1, shared on r0"
    alone = _describe_late(late._replace(shared_with=None), {("a", 5): "r1"})
    assert alone.endswith("no earlier prompt; evaluated 772, bound 100; on r1")


def test_a_request_carries_its_session_and_its_record_the_replica_that_answered():
    """Through a stand-in transport: the conversation id goes out as x-session-id (what a router's
    session affinity keys on), and the reply's x-hybridcache-replica comes back in the record."""
    import httpx2  # the openai client's HTTP library
    from openai import AsyncOpenAI

    seen: list[httpx2.Request] = []
    chunks = [{"id": "c", "object": "text_completion", "created": 0, "model": "m",
               "choices": [{"index": 0, "text": "a", "finish_reason": None, "logprobs": None}]},
              {"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [],
               "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
                         "prompt_tokens_details": {"cached_tokens": 0}}}]
    events = [msgspec.json.encode(chunk).decode() for chunk in chunks] + ["[DONE]"]
    stream = "".join(f"data: {event}\n\n" for event in events)

    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, text=stream, headers={"content-type": "text/event-stream",
                                                          "x-hybridcache-replica": "r1"})

    request = PlannedRequest(conversation="trace_0006", turn=2, arrival_s=0.0, think_s=0.0, max_tokens=1,
                             prompt_token_ids=(1, 2, 3))

    async def send() -> RequestRecord:
        transport = httpx2.MockTransport(answer)
        async with AsyncOpenAI(base_url="http://router/v1", api_key="none", max_retries=0,
                               http_client=httpx2.AsyncClient(transport=transport)) as client:
            return await send_request(client, "m", request, 0.0, session="trace_0006")

    record = asyncio.run(send())
    assert record.ok, record.error
    assert (record.replica, record.prompt_tokens) == ("r1", 3)
    assert seen[0].headers["x-session-id"] == "trace_0006"


def test_a_missing_trace_file_is_exit_2_with_its_name(tmp_path):
    status, _, err = run_cli(str(tmp_path / "nope.jsonl"), "--server", "http://127.0.0.1:9")
    assert status == 2 and "nope.jsonl: no such trace file" in err


def test_a_file_that_is_no_trace_is_exit_2_naming_the_format_problem(tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text("this is not json\n")
    status, _, err = run_cli(str(bad), "--server", "http://127.0.0.1:9")
    assert status == 2 and "notes.jsonl: not a trace" in err


def test_an_unreachable_server_is_exit_2_naming_it(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    status, _, err = run_cli(str(chat_trace_file(tmp_path)), "--server", url)
    assert status == 2 and f"cannot reach {url}" in err


def test_a_plot_into_a_missing_directory_is_refused_before_any_work(tmp_path):
    status, _, err = run_cli(str(chat_trace_file(tmp_path)), "--server", "http://127.0.0.1:9",
                             "--plot", str(tmp_path / "no" / "ttft.png"))
    assert status == 2 and "no such directory" in err


def test_without_the_openai_client_it_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` raises ImportError
    status, _, err = run_cli(str(chat_trace_file(tmp_path)), "--server", "http://127.0.0.1:9")
    assert status == 2 and "pip install openai" in err


def test_a_nocache_server_alone_is_refused(tmp_path):
    status, _, err = run_cli(str(chat_trace_file(tmp_path)), "--nocache-server", "http://127.0.0.1:9")
    assert status == 2 and "--nocache-server needs --server" in err


def test_servers_the_bench_starts_size_their_kv_pool_as_serve_does_unless_told():
    auto = ServeFlags(Path("/models/m"), kv_pages=None).command()
    assert "--kv-capacity" not in auto  # serve's --kv-capacity auto: long traces' prompts fit
    told = ServeFlags(Path("/models/m"), kv_pages=256).command()
    assert told[told.index("--kv-capacity") + 1] == "256"


def test_a_server_that_cannot_start_is_reported_with_its_log(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ServeLaunchError, match="exited with 2"):
        ServeProcess.launch(ServeFlags(tmp_path), startup_timeout_s=120)


# --- against a live server (micro checkpoint) ---------------------------------------------------------

@pytest.fixture(scope="module")
def micro_server(micro_checkpoint: Path) -> Iterator[ServeProcess]:
    with ServeProcess.launch(ServeFlags(micro_checkpoint, kv_pages=256)) as server:
        yield server
    assert server.process.returncode == 0, server.recent_log()  # an orderly stop


def test_the_client_records_ttft_and_the_cached_tokens_of_a_second_turn(micro_server, tmp_path):
    trace = load_trace(chat_trace_file(tmp_path))  # chat-0: a 201-token first turn, so blocks to reuse
    conversation = plan_replay(trace, LIMITS._replace(max_output_tokens=4), None).conversations[0]
    server = probe_server(micro_server.url)

    async def two_turns() -> list[RequestRecord]:
        async with make_client(server) as client:
            return [await send_request(client, server.model, r, 0.0) for r in conversation.requests[:2]]

    first, second = asyncio.run(two_turns())
    for answered in (first, second):
        assert answered.ok, answered.error
        assert 0 < answered.ttft_s <= answered.total_s
        assert answered.completion_tokens == 4
    assert first.cached_tokens == 0 and second.prompt_tokens > first.prompt_tokens
    assert 0 < second.cached_tokens < second.prompt_tokens
    address = micro_server.url.removeprefix("http://")  # a lone serve names itself by its address
    assert first.replica == second.replica == address


def test_a_block_id_trace_replays_through_completions_with_token_prompts(micro_server, micro_checkpoint):
    status, lines, err = run_cli(str(WEKA), "--server", micro_server.url, "--checkpoint",
                                 str(micro_checkpoint), "--time-scale", "0", "--max-prompt-tokens", "256",
                                 "--max-output-tokens", "4", "--concurrency", "1")
    assert status == 0, err
    assert lines["endpoint"] == "completion" and lines["requests"] == "6"
    assert lines["cache.evaluated_tokens"] == lines["cache.computed_tokens"]
    assert 0 < int(lines["cache.bound_tokens"]) <= int(lines["cache.evaluated_tokens"])
    assert float(lines["cache.evaluated_vs_bound"]) >= 1.0
    assert lines["cache.requests_ok"] == "6" and lines["cache.errors"] == "0"
    assert int(lines["cache.cached_tokens"]) > 0  # later turns extend earlier ones
    assert int(lines["cache.output_tokens"]) == 6 * 4
    assert "ttft_p50_vs_nocache" not in lines
    assert "[cache] 6/6" in err  # progress on stderr


@pytest.fixture(scope="module")
def full_run(micro_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, str, Path]:
    """The whole benchmark as a user runs it: it starts both servers itself."""
    directory = tmp_path_factory.mktemp("bench-trace")
    plot = directory / "ttft.png"
    status, lines, err = run_cli(str(chat_trace_file(directory)), "--checkpoint", str(micro_checkpoint),
                                 "--max-requests", "8", "--time-scale", "0", "--max-output-tokens", "4",
                                 "--kv-pages", "256", "--plot", str(plot))
    return status, lines, err, plot


def test_both_started_servers_answer_every_request(full_run):
    status, lines, err, _ = full_run
    assert status == 0, err
    assert lines["requests"] == "8" and lines["endpoint"] == "chat"
    for label in ("cache", "nocache"):
        assert lines[f"{label}.requests_ok"] == "8" and lines[f"{label}.errors"] == "0"
        assert_percentiles_ordered(lines, label)
        assert lines[f"{label}.output_tokens"] == str(8 * 4)
    assert lines["cache.prompt_tokens"] == lines["nocache.prompt_tokens"]


def test_only_the_cached_server_saves_prefill(full_run):
    lines = full_run[1]
    assert int(lines["cache.cached_tokens"]) > 0 and lines["nocache.cached_tokens"] == "0"
    assert int(lines["cache.computed_tokens"]) == int(lines["cache.prompt_tokens"]) - int(
        lines["cache.cached_tokens"])
    assert int(lines["cache.computed_tokens"]) < int(lines["nocache.computed_tokens"])
    assert lines["prefill_tokens_computed"] == lines["cache.computed_tokens"]
    assert lines["prefill_tokens_saved"] == lines["cache.cached_tokens"]


def test_the_ratios_are_quotients_of_the_printed_values_and_the_plot_is_written(full_run):
    _, lines, _, plot = full_run
    assert_ratio(lines, "ttft_p50_vs_nocache", "cache.ttft_p50_s", "nocache.ttft_p50_s")
    assert_ratio(lines, "computed_vs_nocache", "cache.computed_tokens", "nocache.computed_tokens")
    assert lines["plot"] == str(plot) and plot.read_bytes().startswith(PNG_MAGIC)
