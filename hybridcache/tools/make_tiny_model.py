"""`hybridcache make-tiny-model DIR --preset {micro,tiny,small}`: random-weight Qwen3.5 checkpoints.

A checkpoint is a Hugging Face directory that transformers' `Qwen3_5ForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` load unchanged: config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with the chat template), chat_template.jinja and generation_config.json. The same
preset, seed and dtype always give byte-identical files.

The server's embedded default is the `tiny` preset, built once into the user's cache directory
(`default_model_dir()`, `ensure_default_model()`); `ensure_checkpoint()` does the same for any directory
(tests use it to build a preset once per session).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from safetensors.torch import save_file

from hybridcache import __version__
from hybridcache.tools.tiny_model.presets import (
    PRESETS,
    Preset,
    StorageDType,
    config_json,
    generation_config_json,
    get_preset,
)
from hybridcache.tools.tiny_model.vocab import TokenizerFiles, byte_tokenizer, qwen3_5_tokenizer
from hybridcache.tools.tiny_model.weights import TORCH_DTYPES, random_weights

CHAT_TEMPLATE_RESOURCE = "qwen3_5_chat.jinja"
# Bump when the files a preset produces change, so a stale embedded default is rebuilt.
BUILDER_FORMAT = 1
DEFAULT_PRESET = "tiny"
DEFAULT_SEED = 0


def chat_template_source() -> str:
    """Our Qwen3.5 chat template (package data). Pure."""
    return resources.files("hybridcache.tools.tiny_model").joinpath(CHAT_TEMPLATE_RESOURCE).read_text("utf-8")


def build_checkpoint(directory: str | Path, preset: str | Preset, seed: int = DEFAULT_SEED,
                     dtype: StorageDType | None = None) -> Path:
    """Write a random-weight checkpoint of `preset` into `directory` (created if needed); returns its path.

    Overwrites the files it writes; leaves other files alone. Deterministic: the same (preset, seed,
    dtype) give byte-identical files. Raises ValueError for an unknown preset or dtype, OSError when the
    directory cannot be written.
    """
    shape = get_preset(preset) if isinstance(preset, str) else preset
    storage = dtype or shape.default_dtype
    if storage not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {storage!r}; known: {', '.join(TORCH_DTYPES)}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = qwen3_5_tokenizer() if shape.vocabulary == "qwen3_5" else byte_tokenizer()
    if tokenizer.num_tokens > shape.vocab_size:
        raise ValueError(f"preset {shape.name}: vocab_size {shape.vocab_size} < {tokenizer.num_tokens}")
    template = chat_template_source()
    end_of_text = tokenizer.added_token_ids["<|endoftext|>"]
    im_end = tokenizer.added_token_ids["<|im_end|>"]
    _write_json(root / "config.json", config_json(shape, storage, eos_token_id=end_of_text))
    _write_json(root / "generation_config.json", generation_config_json([im_end, end_of_text], end_of_text))
    (root / "tokenizer.json").write_text(tokenizer.tokenizer_json, encoding="utf-8")
    _write_json(root / "tokenizer_config.json", tokenizer_config_json(tokenizer, template, shape))
    (root / "chat_template.jinja").write_text(template, encoding="utf-8")
    weights = random_weights(shape, seed, storage)
    save_file(weights, str(root / "model.safetensors"), metadata={"format": "pt"})
    return root


def tokenizer_config_json(tokenizer: TokenizerFiles, chat_template: str, shape: Preset) -> dict[str, object]:
    """tokenizer_config.json: Qwen's token roles, the added tokens, and the chat template. Pure."""
    decoder = json.loads(tokenizer.tokenizer_json)["added_tokens"]
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(entry["id"]): {key: value for key, value in entry.items() if key != "id"} for entry in decoder
        },
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": shape.max_position_embeddings,
        "split_special_tokens": False,
        "chat_template": chat_template,
    }


def _write_json(path: Path, document: dict[str, object]) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def cache_root() -> Path:
    """hybridcache's folder in the user cache: $XDG_CACHE_HOME/hybridcache, ~/.cache/hybridcache when
    XDG_CACHE_HOME is unset. Pure (reads the environment only)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "hybridcache"


def preset_dir(preset: str) -> Path:
    """Where a preset (seed 0) is kept: `cache_root()`/models/PRESET-VERSION-fFORMAT. Pure."""
    return cache_root() / "models" / f"{preset}-{__version__}-f{BUILDER_FORMAT}"


def ensure_preset(preset: str) -> Path:
    """The preset's checkpoint (seed 0) in the user cache directory, built first if absent."""
    return ensure_checkpoint(preset_dir(preset), preset, DEFAULT_SEED)


def default_model_dir() -> Path:
    """Where the embedded default (`tiny`, seed 0) lives (see `preset_dir`). Pure."""
    return preset_dir(DEFAULT_PRESET)


def ensure_default_model() -> Path:
    """The embedded default checkpoint (`tiny`, seed 0), built first if absent; returns its directory.

    Raises OSError when the cache directory cannot be written.
    """
    return ensure_checkpoint(default_model_dir(), DEFAULT_PRESET, DEFAULT_SEED)


def ensure_checkpoint(directory: str | Path, preset: str | Preset, seed: int = DEFAULT_SEED,
                      dtype: StorageDType | None = None) -> Path:
    """`directory` holding a built checkpoint: returned as is if it exists, else built there atomically.

    Builds into a temporary sibling directory and renames it into place, so a reader never sees a
    half-written checkpoint; when two processes race, the loser discards its copy. An existing directory
    is trusted (only a complete build is ever renamed into place). Raises OSError when the parent
    cannot be written, ValueError for an unknown preset or dtype.
    """
    target = Path(directory)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-building-", dir=target.parent))
    try:
        build_checkpoint(staging, preset, seed, dtype)
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add make-tiny-model's arguments to `parser`. Mutates `parser`."""
    parser.add_argument("directory", metavar="DIR", type=Path, help="checkpoint directory to write")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=DEFAULT_PRESET,
                        help="micro: byte vocabulary, unit tests; tiny: real vocabulary, embedded default; "
                             "small: benchmark shape (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="weight seed (default: %(default)s)")
    parser.add_argument("--dtype", choices=sorted(TORCH_DTYPES), default=None,
                        help="storage dtype (default: float32 for micro/tiny, bfloat16 for small)")


def run(args: argparse.Namespace) -> int:
    """Build the checkpoint `args` describe and print where it went; returns the exit status."""
    try:
        root = build_checkpoint(args.directory, args.preset, seed=args.seed, dtype=args.dtype)
    except (OSError, ValueError) as error:
        print(f"make-tiny-model: {error}", file=sys.stderr)
        return 1
    size = sum(path.stat().st_size for path in root.iterdir() if path.is_file())
    print(f"wrote {args.preset} checkpoint (seed {args.seed}) to {root} ({size / 2**20:.1f} MiB)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry point: `python -m hybridcache.tools.make_tiny_model DIR --preset tiny`."""
    parser = argparse.ArgumentParser(
        prog="hybridcache make-tiny-model", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
