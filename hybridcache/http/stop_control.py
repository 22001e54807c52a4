"""What a stop signal means right now (spec §5.5): SIGTERM stops; Ctrl+C needs a second press.

Pure state machine; the clock is passed in so tests can drive it.
"""

from __future__ import annotations

import enum

CONFIRM_WINDOW_S = 5.0


class StopAction(enum.Enum):
    IGNORE_ASK_CONFIRM = "ask to press Ctrl+C again to stop"
    STOP = "stop in order"
    EXIT_NOW = "exit at once"


class StopControl:
    """Decides the action for each signal. Mutates only its own fields."""

    def __init__(self, confirm_window_s: float = CONFIRM_WINDOW_S) -> None:
        self._confirm_window_s = confirm_window_s
        self._last_interrupt: float | None = None
        self.stopping = False

    def on_terminate(self) -> StopAction:
        """SIGTERM: an orderly stop; while a stop is already running, nothing more."""
        if self.stopping:
            return StopAction.IGNORE_ASK_CONFIRM
        self.stopping = True
        return StopAction.STOP

    def on_interrupt(self, now: float) -> StopAction:
        """Ctrl+C at monotonic time `now`: confirm, then stop; once stopping, exit at once."""
        if self.stopping:
            return StopAction.EXIT_NOW
        last, self._last_interrupt = self._last_interrupt, now
        if last is not None and now - last <= self._confirm_window_s:
            self.stopping = True
            return StopAction.STOP
        return StopAction.IGNORE_ASK_CONFIRM
