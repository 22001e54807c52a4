"""Limits on what one request may ask for, so a single body cannot make the server do unbounded work.

Stop strings are scanned on every output chunk on the event loop (the cost grows with their number and
length); tools and messages are rendered by the chat template and tokenized. The numbers are generous
for real clients (OpenAI allows 4 stop sequences and 128 tools; `top_logprobs` is 0..20 everywhere and
checked by `SamplingParams`). Every check raises ApiError 400 naming the field; nothing mutates.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridcache.http.errors import bad_request

MAX_STOP_STRINGS = 32
MAX_STOP_STRING_CHARS = 1024
MAX_TOOLS = 256
MAX_MESSAGES = 4096


def checked_stop_strings(stop: str | Sequence[str] | None, param: str = "stop") -> tuple[str, ...]:
    """The stop strings of a request field (a string or a list), within the limits. Raises ApiError 400."""
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise bad_request(f"{param}: at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}", param)
    for position, text in enumerate(stops):
        if len(text) > MAX_STOP_STRING_CHARS:
            raise bad_request(f"{param}[{position}]: a stop string has at most {MAX_STOP_STRING_CHARS} "
                              f"characters, got {len(text)}", param)
    return stops


def check_conversation_size(messages: Sequence[object], tools: Sequence[object] | None) -> None:
    """Raises ApiError 400 for more than MAX_MESSAGES messages or MAX_TOOLS tools."""
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"messages: at most {MAX_MESSAGES} messages, got {len(messages)}", "messages")
    if tools is not None and len(tools) > MAX_TOOLS:
        raise bad_request(f"tools: at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
