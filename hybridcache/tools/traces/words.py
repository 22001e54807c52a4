"""Built-in text for generated traces: a fixed word list and prose / code / log makers (no downloads).

Every maker takes a `random.Random` and a size in approximate tokens (~4 characters per token) and
consumes the generator deterministically: the same generator state gives the same text. Pure otherwise.
"""

from __future__ import annotations

import random

CHARS_PER_TOKEN = 4

_WORD_TEXT = """
the of and to in is that for it as with was on be by this are or from at an but not have has had were
which their can all more one will would there been also into other its only than some when time these
may such them any new most used two first each over like way could about after system data model cache
request server token block state layer memory device host value result error test build module function
class method field buffer thread queue event stream batch prefix suffix index table node tree branch
page slot image snapshot restore commit evict policy budget chunk prefill decode sample logit vector
matrix kernel shape tensor weight config option flag path file line column output input user agent tool
call argument return string number list map key record schema parse write read open close start stop
retry timeout latency throughput worker process network client session context window history message
reply answer question problem solution reason plan step check verify measure compare report summary
detail example change update remove insert replace search match filter sort group merge split join
format encode decode hash digest signal handler route endpoint status header body payload response
quick careful simple small large fast slow early late exact rough stable fresh stale empty full
"""
WORDS = tuple(_WORD_TEXT.split())

IDENTIFIERS = ("cache", "index", "block", "state", "page", "slot", "node", "tree", "lane", "batch",
               "token", "event", "queue", "stream", "model", "layer", "value", "limit", "count", "size")

TOOL_NAMES = ("read_file", "run_command", "search_code", "edit_file")


def prose(rng: random.Random, tokens: int) -> str:
    """Sentences of list words, about `tokens` tokens long (at least one word)."""
    target = max(1, tokens) * CHARS_PER_TOKEN
    sentences: list[str] = []
    length = 0
    while length < target:
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        sentence = " ".join(words).capitalize() + rng.choice((".", ".", ".", "?", "!"))
        sentences.append(sentence)
        length += len(sentence) + 1
    return " ".join(sentences)


def code(rng: random.Random, tokens: int) -> str:
    """Python-looking source, about `tokens` tokens long."""
    target = max(1, tokens) * CHARS_PER_TOKEN
    lines: list[str] = []
    length = 0
    while length < target:
        name = f"{rng.choice(IDENTIFIERS)}_{rng.choice(IDENTIFIERS)}"
        arg = rng.choice(IDENTIFIERS)
        body = [f"def {name}({arg}, limit={rng.randint(1, 512)}):",
                f"    \"\"\"{prose(rng, 8)}\"\"\"",
                f"    if {arg} is None or len({arg}) > limit:",
                f"        raise ValueError(\"{rng.choice(WORDS)} {rng.choice(WORDS)}\")",
                f"    return [{rng.choice(IDENTIFIERS)} * {rng.randint(2, 64)} for {arg[0]} in {arg}]",
                ""]
        lines.extend(body)
        length += sum(len(line) + 1 for line in body)
    return "\n".join(lines)


def log_lines(rng: random.Random, tokens: int) -> str:
    """Command output: timestamped log lines, about `tokens` tokens long."""
    target = max(1, tokens) * CHARS_PER_TOKEN
    lines: list[str] = []
    length = 0
    while length < target:
        level = rng.choice(("INFO", "INFO", "DEBUG", "WARN", "ERROR"))
        line = (f"[{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}] {level} "
                f"{rng.choice(IDENTIFIERS)}: {prose(rng, rng.randint(6, 20))}")
        lines.append(line)
        length += len(line) + 1
    return "\n".join(lines)


def file_path(rng: random.Random) -> str:
    """A plausible source path."""
    return f"src/{rng.choice(IDENTIFIERS)}/{rng.choice(IDENTIFIERS)}_{rng.choice(IDENTIFIERS)}.py"
