"""HTTP server options (address, keys, limits), separate from the engine's."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from hybridcache.config import DEFAULT_MAX_CONCURRENCY, OptionError
from hybridcache.persistence.file_safety import UnsafeFileError, check_trusted_file

DEFAULT_MAX_BODY_BYTES = 32 << 20
# The output cap of a request that sets no max_tokens. "The rest of the context" (vLLM's choice) is
# hundreds of thousands of tokens on Qwen3.5, which looks like a hang; 1024 is a few seconds to minutes.
DEFAULT_MAX_TOKENS = 1024
WAITING_PER_LANE = 64  # --max-waiting default: this many queued requests per lane
API_KEY_ENV = "HYBRIDCACHE_API_KEY"


class ServerOptions(msgspec.Struct, frozen=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    api_keys: tuple[str, ...] = ()
    metrics_require_api_key: bool = False  # --metrics-require-api-key: /metrics needs a key too
    log_level: str = "info"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    default_max_tokens: int = DEFAULT_MAX_TOKENS  # output cap when a request sets none
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY  # the engine's lanes; requests beyond them wait
    max_waiting: int | None = None  # --max-waiting; None = WAITING_PER_LANE x max_concurrency
    replica_id: str | None = None  # --replica-id; None = "host:port"

    def replica_name(self, bound_port: int | None = None) -> str:
        """What this server calls itself in the `x-hybridcache-replica` header and /server_info: the
        `--replica-id` given (`cluster` gives r0, r1, ...), else the address it listens on (`bound_port`:
        the port it got when asked for port 0)."""
        return self.replica_id or f"{self.host}:{bound_port or self.port}"

    @property
    def waiting_limit(self) -> int:
        """How many generation requests may wait for a lane before the next gets 429."""
        return WAITING_PER_LANE * self.max_concurrency if self.max_waiting is None else self.max_waiting

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> ServerOptions:
        """Build and validate from parsed `serve` flags and the environment (HYBRIDCACHE_API_KEY); raises
        `OptionError` naming the flag. Reads the key file; writes nothing."""
        if not 0 <= args.port <= 65535:
            raise OptionError("--port", "must be between 0 and 65535")
        if args.default_max_tokens < 1:
            raise OptionError("--default-max-tokens", "must be a positive number of tokens")
        keys = api_keys_from(args, os.environ if environ is None else environ)
        metrics_need_key = bool(getattr(args, "metrics_require_api_key", False))
        if metrics_need_key and not keys:
            raise OptionError("--metrics-require-api-key", "needs an API key (--api-key, --api-key-file or "
                              f"{API_KEY_ENV})")
        max_waiting = getattr(args, "max_waiting", None)
        if max_waiting is not None and max_waiting < 0:
            raise OptionError("--max-waiting", "must not be negative")
        replica_id = getattr(args, "replica_id", None)
        if replica_id is not None and not _is_header_token(replica_id):
            raise OptionError("--replica-id", "must be 1-64 visible ASCII characters without spaces")
        return cls(
            host=args.host,
            port=args.port,
            served_model_name=args.served_model_name,
            api_keys=keys,
            metrics_require_api_key=metrics_need_key,
            log_level=args.log_level,
            default_max_tokens=args.default_max_tokens,
            max_concurrency=getattr(args, "max_concurrency", DEFAULT_MAX_CONCURRENCY),
            max_waiting=max_waiting,
            replica_id=replica_id,
        )


def _is_header_token(text: str) -> bool:
    """Whether `text` can be sent as an HTTP header value as it is (it is echoed in every response)."""
    return 0 < len(text) <= 64 and all(33 <= ord(char) <= 126 for char in text)


def api_keys_from(args: argparse.Namespace, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Every accepted key: `--api-key` values (visible to local users in argv), the lines of
    `--api-key-file` (blank lines and `#` comments skipped), and HYBRIDCACHE_API_KEY. Raises OptionError."""
    keys = list(args.api_key or ())
    if any(not key for key in keys):
        raise OptionError("--api-key", "must not be empty")
    key_file = getattr(args, "api_key_file", None)
    if key_file is not None:
        keys.extend(_keys_in_file(key_file))
    from_env = environ.get(API_KEY_ENV)
    if from_env is not None:
        if not from_env.strip():
            raise OptionError(API_KEY_ENV, "is set but empty")
        keys.append(from_env.strip())
    return tuple(dict.fromkeys(keys))


def _keys_in_file(name: str) -> list[str]:
    path = Path(os.path.abspath(os.path.expanduser(name)))
    try:
        check_trusted_file(path, "API key file")
        text = path.read_text()
    except UnsafeFileError as error:
        raise OptionError("--api-key-file", str(error)) from None
    except (OSError, UnicodeDecodeError) as error:
        raise OptionError("--api-key-file", f"cannot read {path}: {error}") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise OptionError("--api-key-file", f"{path} holds no key (one key per line)")
    return keys
