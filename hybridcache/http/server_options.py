"""HTTP server options (address, keys, limits), separate from the engine's."""

from __future__ import annotations

import argparse

import msgspec

from hybridcache.config import OptionError

DEFAULT_MAX_BODY_BYTES = 32 << 20


class ServerOptions(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_keys: tuple[str, ...] = ()
    log_level: str = "info"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServerOptions:
        """Build and validate from parsed `serve` flags; raises `OptionError` naming the flag."""
        if not 0 <= args.port <= 65535:
            raise OptionError("--port", "must be between 0 and 65535")
        keys = tuple(args.api_key or ())
        if any(not key for key in keys):
            raise OptionError("--api-key", "must not be empty")
        return cls(
            host=args.host,
            port=args.port,
            served_model_name=args.served_model_name,
            api_keys=keys,
            log_level=args.log_level,
        )
