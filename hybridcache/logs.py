"""Logging: one logger tree `hybridcache.*`, the startup ledger, and progress lines for long phases."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

ROOT_LOGGER = "hybridcache"


def get_logger(name: str) -> logging.Logger:
    """A logger below `hybridcache`; `name` is usually the caller's `__name__`."""
    if name == ROOT_LOGGER or name.startswith(ROOT_LOGGER + "."):
        return logging.getLogger(name)
    return logging.getLogger(f"{ROOT_LOGGER}.{name}")


def setup_logging(level: str = "info") -> None:
    """Send the `hybridcache` tree to stderr with timestamps. Idempotent (replaces our own handler)."""
    root = logging.getLogger(ROOT_LOGGER)
    for handler in list(root.handlers):
        if getattr(handler, "_hybridcache", False):
            root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname).1s %(name)s: %(message)s", "%H:%M:%S"))
    handler._hybridcache = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level.upper())
    root.propagate = False


def log_ledger(logger: logging.Logger, title: str, rows: Iterable[tuple[str, object]]) -> None:
    """Log a startup ledger: one aligned `name  value` line per row under a title line."""
    rows = list(rows)
    width = max((len(name) for name, _ in rows), default=0)
    logger.info("%s", title)
    for name, value in rows:
        logger.info("  %s  %s", name.ljust(width), value)


def format_bytes(nbytes: float) -> str:
    """Human-readable binary size: 1536 -> '1.5 KiB'."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


class Progress:
    """Progress lines for a long phase: at most one line per `interval_s`, plus a closing line.

    Mutates only its own counters. `update(done)` sets the amount done so far (bytes, items, ...).
    """

    def __init__(
        self, logger: logging.Logger, phase: str, total: float, unit: str = "", interval_s: float = 2.0
    ) -> None:
        self._logger = logger
        self._phase = phase
        self._total = total
        self._unit = unit
        self._interval_s = interval_s
        self._start = time.monotonic()
        self._last = self._start
        self.done = 0.0

    def update(self, done: float) -> None:
        self.done = done
        now = time.monotonic()
        if now - self._last >= self._interval_s:
            self._last = now
            share = 100.0 * done / self._total if self._total else 100.0
            self._logger.info(
                "%s: %.0f%% (%s of %s)", self._phase, share, self._fmt(done), self._fmt(self._total)
            )

    def finish(self) -> float:
        """Log the closing line with the elapsed time and rate; returns the elapsed seconds."""
        elapsed = time.monotonic() - self._start
        rate = self.done / elapsed if elapsed > 0 else float("inf")
        self._logger.info(
            "%s: done, %s in %.2f s (%s/s)", self._phase, self._fmt(self.done), elapsed, self._fmt(rate)
        )
        return elapsed

    def _fmt(self, amount: float) -> str:
        return format_bytes(amount) if self._unit == "bytes" else f"{amount:.0f}{self._unit}"
