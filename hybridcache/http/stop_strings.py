"""Stop strings over streamed text: release text as soon as it cannot be the start of a stop string.

The stop string that completes first wins (the earliest end; of two ending together, the one that starts
earlier), which is what a client watching the stream sees, so the result never depends on how the text
was cut into pieces.
`StopStringMatcher.push(delta)` returns the text that is safe to emit and whether a stop string was hit;
on a hit the stop string and everything after it are dropped (OpenAI and Anthropic both exclude it).
Text that could still grow into a stop string is held back until the next push or `flush()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StopCheck(NamedTuple):
    """What one push released: `text` to emit, and the stop string hit (None while none was)."""

    text: str
    stop: str | None


class StopStringMatcher:
    """Finds the earliest stop string in a text stream. Mutates itself; one per request."""

    def __init__(self, stops: Sequence[str]) -> None:
        """`stops`: the stop strings; empty strings are ignored. Raises nothing."""
        self._stops = tuple(stop for stop in dict.fromkeys(stops) if stop)
        self._held = ""
        self.hit: str | None = None

    @property
    def active(self) -> bool:
        return bool(self._stops)

    def push(self, delta: str) -> StopCheck:
        """Add `delta`; returns the releasable text and the stop string if one completed. After a hit,
        every later push returns empty text. Mutates."""
        if self.hit is not None:
            return StopCheck("", self.hit)
        if not self._stops:
            return StopCheck(delta, None)
        text = self._held + delta
        found = self._earliest_stop(text)
        if found is not None:
            position, stop = found
            self.hit = stop
            self._held = ""
            return StopCheck(text[:position], stop)
        keep = self._longest_partial_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return StopCheck(text[: len(text) - keep], None)

    def flush(self) -> str:
        """The text still held back (generation ended without completing a stop string). Mutates."""
        held, self._held = self._held, ""
        return "" if self.hit is not None else held

    def _earliest_stop(self, text: str) -> tuple[int, str] | None:
        """(start, stop) of the stop string whose first occurrence in `text` ends first; None if none."""
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            position = text.find(stop)
            if position >= 0 and (best is None or (position + len(stop), position) < best[:2]):
                best = (position + len(stop), position, stop)
        return None if best is None else (best[1], best[2])

    def _longest_partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if stop.startswith(text[len(text) - length:]):
                    longest = length
                    break
        return longest
