"""A strict reader of the Prometheus text format for tests: every line must be a comment or a sample."""

from __future__ import annotations

import re

LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\.)*)"')
SAMPLE = re.compile(rf'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{{(?P<labels>{LABEL}(,{LABEL})*)\}})? '
                    r'(?P<value>[-+]?(\d+(\.\d*)?(e[-+]?\d+)?|\+Inf|NaN))$')
COMMENT = re.compile(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$")

SampleKey = tuple[str, frozenset[tuple[str, str]]]


def parse_metrics(text: str) -> dict[SampleKey, float]:
    """{(name, {(label, value), ...}): value} of every sample. Fails on a line that is neither a comment
    nor a sample. Label values stay escaped as in the text."""
    samples = {}
    for line in text.strip().split("\n"):
        if line.startswith("#"):
            assert COMMENT.match(line), line
            continue
        found = SAMPLE.match(line)
        assert found, f"not a Prometheus sample: {line!r}"
        labels = frozenset(LABEL_PAIR.findall(found.group("labels") or ""))
        samples[(found.group("name"), labels)] = float(found.group("value"))
    return samples


def sample(samples: dict[SampleKey, float], name: str, **labels: str) -> float:
    """The value of `name` with exactly `labels`; KeyError when absent."""
    return samples[(name, frozenset(labels.items()))]
