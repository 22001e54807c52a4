"""Trace readers (WEKA Claude-Code JSON, Mooncake JSONL, our JSONL), normalized records, token expansion.

    trace = load_trace("../shared/traces/weka-claude-code", shared_prefix=True)
    for request in trace.requests():
        tokens = expand_tokens(request, vocab_size=151643)

See `model.py` for what the records promise, `jsonl.py` for our own format.
"""

from hybridcache.tools.traces.expand import expand_token_array, expand_tokens
from hybridcache.tools.traces.jsonl import TraceLine, encode_line, text_block_ids
from hybridcache.tools.traces.load import detect_format, load_trace
from hybridcache.tools.traces.model import Conversation, Trace, TraceFormatError, TraceRequest

__all__ = [
    "Conversation",
    "Trace",
    "TraceFormatError",
    "TraceLine",
    "TraceRequest",
    "detect_format",
    "encode_line",
    "expand_token_array",
    "expand_tokens",
    "load_trace",
    "text_block_ids",
]
