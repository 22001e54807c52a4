"""The README's first examples run as written against a live `tiny` server.

The snippets are read from README.md itself (every ```sh block that starts with `curl` and every
```python block), so the README cannot drift from what works. The only change made to a snippet is the
address: the test server listens on a free port instead of 8000.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.http.server_process import ServerProcess

README = Path(__file__).resolve().parents[1] / "README.md"
README_ADDRESS = "127.0.0.1:8000"
SNIPPET_LIMIT_S = 30
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
CACHED_TOKENS = re.compile(r"cached_tokens\D*(\d+)")


def readme_snippets(language: str, starts_with: str = "") -> list[str]:
    """The README's fenced blocks in `language` whose text starts with `starts_with`, in order."""
    blocks = [body for lang, body in FENCE.findall(README.read_text()) if lang == language]
    return [body for body in blocks if body.lstrip().startswith(starts_with)]


CURL_SNIPPETS = readme_snippets("sh", "curl ")
PYTHON_SNIPPETS = readme_snippets("python")


@pytest.fixture(scope="module")
def readme_server(tiny_checkpoint: Path) -> Iterator[ServerProcess]:
    """`hybridcache serve` on the tiny checkpoint under the name the README uses."""
    server = ServerProcess("--model", str(tiny_checkpoint), "--served-model-name", "tiny")
    yield server
    server.stop()


def run_snippet(command: list[str], snippet: str, server: ServerProcess) -> str:
    assert README_ADDRESS in snippet, "a README snippet talks to the default address"
    text = snippet.replace(README_ADDRESS, f"127.0.0.1:{server.port}")
    result = subprocess.run(
        [*command, text], capture_output=True, text=True, timeout=SNIPPET_LIMIT_S
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_readme_has_the_snippets_this_test_runs():
    assert CURL_SNIPPETS and PYTHON_SNIPPETS
    for snippet in CURL_SNIPPETS + PYTHON_SNIPPETS:
        assert "max_tokens" in snippet, "every README request sets max_tokens"


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
@pytest.mark.parametrize("snippet", CURL_SNIPPETS)
def test_readme_curl_snippets_print_an_answer(readme_server: ServerProcess, snippet: str):
    reply = json.loads(run_snippet(["sh", "-c"], snippet, readme_server))
    content = reply["choices"][0]["message"]["content"]
    assert isinstance(content, str) and content.strip()


@pytest.mark.parametrize("snippet", PYTHON_SNIPPETS)
def test_readme_python_snippets_print_text_and_the_second_request_reuses_the_first(
    readme_server: ServerProcess, snippet: str
):
    output = run_snippet([sys.executable, "-c"], snippet, readme_server)
    lines = output.splitlines()
    assert "None" not in (line.strip() for line in lines), "message.content was None"
    cached = [int(value) for value in CACHED_TOKENS.findall(output)]
    assert len(cached) >= 2, output
    assert cached[0] == 0 and cached[-1] > 0, output
    promised = re.search(r"the second prints `cached_tokens: (\d+)`", README.read_text())
    assert promised and cached[-1] == int(promised.group(1)), "the README says what the second request reuses"
    texts = [line for line in lines if line.strip() and not CACHED_TOKENS.search(line)]
    assert len(texts) >= len(cached), output  # random text may hold newlines, never nothing
