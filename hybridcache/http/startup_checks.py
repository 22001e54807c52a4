"""Checks `hybridcache serve` runs before it loads a model or touches a file.

Loading a real checkpoint takes minutes, so everything that can be known from the command line and the
file system is checked first: the address can be bound, and `--model` names a checkpoint directory
(hybridcache never downloads one). Each check raises `OptionError` naming the flag and what to do; none
mutates anything (the probe socket is closed before returning).
"""

from __future__ import annotations

import errno
import json
import re
import socket
from pathlib import Path

from hybridcache.config import OptionError

CHECKPOINT_FILES = "config.json, *.safetensors, tokenizer.json"
# `owner/name` with no leading `/` or `.`: how a Hugging Face hub id looks (a relative path can too, so it
# is only a guess used to word the message).
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def check_model_dir(model: str | None) -> None:
    """Raise `OptionError("--model", ...)` unless `model` is None (the embedded checkpoint) or a directory
    with config.json (a JSON object), at least one *.safetensors file and tokenizer.json. Reads only."""
    if model is None:
        return
    path = Path(model).expanduser()
    if not path.exists():
        if _HUB_ID.fullmatch(model):
            raise OptionError(
                "--model",
                f"{model} is not a local directory (it looks like a Hugging Face hub id, and hybridcache "
                f"downloads nothing); download it first, e.g. `huggingface-cli download {model} "
                f"--local-dir DIR`, then pass --model DIR",
            )
        raise OptionError(
            "--model", f"{model} does not exist; give a local checkpoint directory (nothing is downloaded)"
        )
    if not path.is_dir():
        raise OptionError("--model", f"{model} is a file; give the checkpoint directory ({CHECKPOINT_FILES})")
    config = path / "config.json"
    if not config.is_file():
        raise OptionError(
            "--model",
            f"{model} has no config.json; give a Hugging Face checkpoint directory ({CHECKPOINT_FILES}); "
            "nothing is downloaded",
        )
    try:
        parsed = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise OptionError("--model", f"{config} is not readable JSON ({error})") from None
    if not isinstance(parsed, dict):
        raise OptionError("--model", f"{config} must hold a JSON object")
    if not any(path.glob("*.safetensors")):
        raise OptionError("--model", f"{model} has no *.safetensors weights; give a complete checkpoint")
    if not (path / "tokenizer.json").is_file():
        raise OptionError("--model", f"{model} has no tokenizer.json; give a complete checkpoint")


def check_bindable(host: str, port: int) -> None:
    """Raise `OptionError` naming --host or --port unless every address of `host` can be bound at `port`.

    Binds with SO_REUSEADDR (as the server does) and closes at once. Port 0 only checks the host. Another
    process may still take the port before the server binds it; the server reports that case too.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise OptionError("--host", f"cannot resolve {host!r} ({error.strerror}); give an address") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as error:
                raise bind_error(host, port, error) from None


def bind_error(host: str, port: int, error: OSError) -> OptionError:
    """The `OptionError` for a failed bind of `host:port`. Pure."""
    if error.errno == errno.EADDRINUSE:
        return OptionError(
            "--port",
            f"{host}:{port} is already in use (another server?); stop it or pick another port with "
            "--port N (0 picks a free one)",
        )
    if error.errno == errno.EACCES:
        return OptionError("--port", f"binding port {port} needs privileges; use a port above 1023")
    if error.errno == errno.EADDRNOTAVAIL:
        return OptionError("--host", f"{host} is not an address of this machine; use 127.0.0.1 or 0.0.0.0")
    return OptionError("--host", f"cannot bind {host}:{port} ({error.strerror or error})")
