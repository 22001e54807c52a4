"""llama.cpp's `llama-server` as a side-by-side peer: our checkpoint converted to GGUF, the server started.

Nothing of llama.cpp lives in this repository: the user builds `llama-server` (../shared/peers/llama-server.md
says how) and passes its path. The converter, `convert_hf_to_gguf.py`, is found in the same source tree (the
nearest folder above the binary that holds it) and is run with this Python, which has what it needs (torch,
transformers, safetensors, numpy; the tree's own `gguf-py` is put on the path by the converter itself).
Converted files are kept in the user's cache folder, named by checkpoint and dtype, and reused.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from hybridcache.tools.make_tiny_model import cache_root

CONVERTER = "convert_hf_to_gguf.py"
GGUF_TYPES = {"bfloat16": "bf16", "float32": "f32", "float16": "f16"}


class PeerError(RuntimeError):
    """The peer could not be prepared or started; the message says what to do."""


def find_converter(server: Path) -> Path:
    """`convert_hf_to_gguf.py` in the llama.cpp tree that holds `server`. Raises PeerError."""
    for folder in server.resolve().parents:
        candidate = folder / CONVERTER
        if candidate.is_file():
            return candidate
    raise PeerError(f"no {CONVERTER} in any folder above {server}: pass the llama-server of a llama.cpp tree")


def converted_gguf(checkpoint: Path, dtype: str, converter: Path) -> Path:
    """The checkpoint as a GGUF file of `dtype`, converted once into the cache folder. Raises PeerError."""
    key = hashlib.sha256(f"{checkpoint.resolve()}|{_mtime(checkpoint)}".encode()).hexdigest()[:12]
    target = cache_root() / "gguf" / f"{checkpoint.name}-{key}-{GGUF_TYPES[dtype]}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    print(f"converting {checkpoint} to {target} with {converter}", file=sys.stderr)
    command = [sys.executable, str(converter), str(checkpoint), "--outfile", str(partial),
               "--outtype", GGUF_TYPES[dtype], "--no-mtp"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PeerError(f"{CONVERTER} failed ({done.returncode}): {done.stderr[-2000:]}")
    partial.rename(target)
    return target


def _mtime(checkpoint: Path) -> int:
    return max(int(path.stat().st_mtime) for path in checkpoint.iterdir())


class LlamaServer:
    """A running `llama-server` on loopback. A context manager; `stop()` kills it."""

    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process = process
        self.url = url

    @classmethod
    def launch(
        cls, server: Path, gguf: Path, port: int, threads: int, context: int, timeout_s: float = 300.0
    ) -> LlamaServer:
        """Start it with one slot of `context` tokens and `threads` threads; wait until /health answers
        200. Raises PeerError when it exits or does not get ready in time."""
        command = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                   "-t", str(threads), "--parallel", "1", "-c", str(context), "--no-webui"]
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise PeerError(f"llama-server exited with {process.returncode}: {' '.join(command)}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as response:
                    if response.status == 200:
                        return cls(process, url)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        process.kill()
        raise PeerError(f"llama-server did not get ready within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> LlamaServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
