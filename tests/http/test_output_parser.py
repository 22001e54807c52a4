"""The output parser splits Qwen3.5 output into reasoning, text and tool calls, however it is chunked."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.http.output_parser import OutputParser, ParsedToolCall, Segment, parse_tool_call

WEATHER_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": "{\\"tz\\": \\"UTC\\"}"}\n</tool_call>'


def parse_whole(text: str, *, reasoning: bool = True, tools: bool = True) -> list[Segment]:
    parser = OutputParser(starts_in_reasoning=reasoning, parse_tools=tools)
    return merge(parser.push(text) + parser.flush())


def parse_chunks(chunks: list[str], *, reasoning: bool = True, tools: bool = True) -> list[Segment]:
    parser = OutputParser(starts_in_reasoning=reasoning, parse_tools=tools)
    segments: list[Segment] = []
    for chunk in chunks:
        segments += parser.push(chunk)
    return merge(segments + parser.flush())


def merge(segments: list[Segment]) -> list[Segment]:
    """Adjacent text segments of one kind joined (streaming may split them anywhere)."""
    merged: list[Segment] = []
    for segment in segments:
        if merged and segment.kind == merged[-1].kind and segment.kind != "tool_call":
            merged[-1] = Segment(segment.kind, merged[-1].text + segment.text)
        else:
            merged.append(segment)
    return merged


def split_at(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


def test_reasoning_then_answer_when_the_prompt_opened_the_think_block():
    segments = parse_whole("The user wants a greeting.\n</think>\n\nHello there!")
    assert segments == [Segment("reasoning", "The user wants a greeting."),
                        Segment("content", "Hello there!")]


def test_a_think_block_the_model_opens_itself_is_reasoning_too():
    segments = parse_whole("<think>\nhmm\n</think>\n\nAnswer.", reasoning=False)
    assert segments == [Segment("reasoning", "hmm"), Segment("content", "Answer.")]


def test_thinking_disabled_output_is_plain_content():
    assert parse_whole("Just the answer.\n", reasoning=False) == [Segment("content", "Just the answer.\n")]


def test_tool_calls_come_back_parsed_with_arguments_as_json_text():
    segments = parse_whole(f"plan\n</think>\n\nLet me check.\n{WEATHER_CALL}\n{TIME_CALL}")
    assert segments[:2] == [Segment("reasoning", "plan"), Segment("content", "Let me check.")]
    calls = [segment.tool_call for segment in segments[2:]]
    assert calls == [ParsedToolCall("get_weather", '{"city": "Paris"}'),
                     ParsedToolCall("get_time", '{"tz": "UTC"}')]


def test_without_tools_offered_tool_tags_stay_text():
    segments = parse_whole(WEATHER_CALL, reasoning=False, tools=False)
    assert segments == [Segment("content", WEATHER_CALL)]


def test_a_malformed_tool_call_is_returned_as_text_not_lost():
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_whole(broken, reasoning=False) == [Segment("content", broken)]


def test_an_unclosed_tool_call_at_the_end_is_returned_as_text():
    unclosed = '<tool_call>\n{"name": "f", "argu'
    assert parse_whole(unclosed, reasoning=False) == [Segment("content", unclosed)]


def test_text_that_looks_like_a_marker_start_is_held_then_released():
    parser = OutputParser(starts_in_reasoning=False, parse_tools=True)
    assert parser.push("a <tool") == [Segment("content", "a")]
    assert parser.push("box> b") == [Segment("content", " <toolbox> b")]


def test_parse_tool_call_rejects_bodies_without_a_name():
    assert parse_tool_call('{"arguments": {}}') is None
    assert parse_tool_call("[1, 2]") is None
    assert parse_tool_call('{"name": "f"}') == ParsedToolCall("f", "{}")


OUTPUTS = st.sampled_from([
    "reasoning here\n</think>\n\nThe answer is 42.",
    f"short\n</think>\n\n{WEATHER_CALL}",
    f"x</think>text before\n{WEATHER_CALL}\n{TIME_CALL}\n",
    "no close tag, all reasoning < think",
    "a</think>b <think>c</think> d <tool_call>{bad}</tool_call> e",
    "ünïcödé ✓ reasoning</think>\n\nрезультат: 😀",
])


@settings(max_examples=60, deadline=None)
@given(text=OUTPUTS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_any_chunking_gives_the_same_segments_as_one_push(text: str, cuts: list[int]):
    assert parse_chunks(split_at(text, cuts)) == parse_whole(text)


@settings(max_examples=40, deadline=None)
@given(words=st.lists(st.text(alphabet="ab <>/\n{}", max_size=6), max_size=10),
       cuts=st.lists(st.integers(min_value=0, max_value=80), max_size=8))
def test_text_without_complete_markers_is_kept_verbatim(words: list[str], cuts: list[int]):
    text = "".join(words)
    while "<think>" in text or "<tool_call>" in text:
        text = text.replace("<think>", "").replace("<tool_call>", "")
    segments = parse_chunks(split_at(text, cuts), reasoning=False)
    assert "".join(segment.text for segment in segments) == text
    assert all(segment.kind != "tool_call" for segment in segments)
