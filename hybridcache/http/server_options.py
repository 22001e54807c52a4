"""HTTP server options (address, keys, limits), separate from the engine's."""

from __future__ import annotations

import argparse

import msgspec

from hybridcache.config import OptionError

DEFAULT_MAX_BODY_BYTES = 32 << 20
# The output cap of a request that sets no max_tokens. "The rest of the context" (vLLM's choice) is
# hundreds of thousands of tokens on Qwen3.5, which looks like a hang; 1024 is a few seconds to minutes.
DEFAULT_MAX_TOKENS = 1024


class ServerOptions(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_keys: tuple[str, ...] = ()
    log_level: str = "info"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    default_max_tokens: int = DEFAULT_MAX_TOKENS  # output cap when a request sets none

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerOptions:
        """Build and validate from parsed `serve` flags; raises `OptionError` naming the flag."""
        if not 0 <= args.port <= 65535:
            raise OptionError("--port", "must be between 0 and 65535")
        keys = tuple(args.api_key or ())
        if any(not key for key in keys):
            raise OptionError("--api-key", "must not be empty")
        if args.default_max_tokens < 1:
            raise OptionError("--default-max-tokens", "must be a positive number of tokens")
        return cls(
            host=args.host,
            port=args.port,
            served_model_name=args.served_model_name,
            api_keys=keys,
            log_level=args.log_level,
            default_max_tokens=args.default_max_tokens,
        )
