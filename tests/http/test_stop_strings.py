"""Stop strings end the text at their first occurrence, however the text arrives."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.http.stop_strings import StopStringMatcher


def run_matcher(stops: list[str], chunks: list[str]) -> tuple[str, str | None]:
    matcher = StopStringMatcher(stops)
    released = []
    for chunk in chunks:
        check = matcher.push(chunk)
        released.append(check.text)
        if check.stop is not None:
            return "".join(released), check.stop
    return "".join(released) + matcher.flush(), None


def expected(stops: list[str], text: str) -> tuple[str, str | None]:
    """The text before the stop string that completes first (earliest end, then earliest start)."""
    found = [(text.find(stop) + len(stop), text.find(stop), stop) for stop in stops if stop and stop in text]
    if not found:
        return text, None
    _, position, stop = min(found)
    return text[:position], stop


def test_the_stop_that_completes_first_wins_however_the_text_is_cut():
    assert run_matcher(["a", "baa"], ["ba", "a"]) == ("b", "a")
    assert run_matcher(["a", "baa"], ["baa"]) == ("b", "a")
    assert run_matcher(["a", "ba"], ["ba"]) == ("", "ba")


def test_the_stop_string_and_what_follows_are_dropped():
    assert run_matcher(["END"], ["Hello E", "N", "D and more"]) == ("Hello ", "END")


def test_a_near_miss_is_released_once_it_cannot_match():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.push("ST").text == ""
    assert matcher.push("ART").text == "START"


def test_the_earliest_of_several_stops_wins():
    assert run_matcher(["world", "lo w"], ["hello world"]) == ("hel", "lo w")


def test_without_stops_everything_passes_through():
    matcher = StopStringMatcher([])
    assert not matcher.active
    assert matcher.push("abc") == ("abc", None)


@settings(max_examples=80, deadline=None)
@given(stops=st.lists(st.text(alphabet="abc", min_size=1, max_size=3), min_size=1, max_size=3),
       chunks=st.lists(st.text(alphabet="abcd", max_size=5), max_size=10))
def test_streamed_matching_equals_matching_the_whole_text(stops: list[str], chunks: list[str]):
    assert run_matcher(stops, chunks) == expected(stops, "".join(chunks))
