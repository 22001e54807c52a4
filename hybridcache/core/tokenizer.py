"""The frontend's tokenizer: a checkpoint's tokenizer.json through `tokenizers`, plus streaming decode.

`Tokenizer.from_dir(dir)` loads `tokenizer.json` and reads the stop tokens from `generation_config.json`
and `config.json`. `IncrementalDetokenizer` turns generated ids into text deltas that never split a UTF-8
character. A missing or malformed file raises `FrontendError` naming the file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer as RustTokenizer

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class FrontendError(Exception):
    """A checkpoint's tokenizer or chat-template file is missing or malformed, or a render failed.

    `path` names the file at fault, or is None when the error is not about a file (a template raised).
    """

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(f"{path}: {message}" if path is not None else message)
        self.path = path
        self.message = message


def read_json_file(path: Path, required: bool) -> dict | None:
    """The JSON object in `path`; None if absent and not required. Raises FrontendError naming the file."""
    if not path.is_file():
        if required:
            raise FrontendError("file not found", path)
        return None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise FrontendError(f"cannot be read as JSON ({error})", path) from error
    if not isinstance(document, dict):
        raise FrontendError("expected a JSON object at the top level", path)
    return document


class Tokenizer:
    """Encode text to ids and decode ids to text, with a checkpoint's added tokens and stop tokens.

    Immutable after construction; safe to share between threads (the Rust tokenizer is thread-safe).
    """

    def __init__(self, backend: RustTokenizer, eos_token_ids: Sequence[int], source: Path | None = None):
        self._backend = backend
        self._eos_token_ids = tuple(dict.fromkeys(eos_token_ids))
        added = backend.get_added_tokens_decoder()
        self._added_ids = {token.content: token_id for token_id, token in added.items()}
        self._special_ids = frozenset(token_id for token_id, token in added.items() if token.special)
        self.source = source

    @classmethod
    def from_dir(cls, directory: str | Path) -> Tokenizer:
        """Load `tokenizer.json` and the stop tokens of a checkpoint directory.

        Stop tokens: `eos_token_id` of generation_config.json, then of config.json (each an int or a list),
        then tokenizer_config.json's `eos_token` by name; duplicates dropped, order kept. Reads files;
        raises FrontendError naming the file when tokenizer.json is missing or malformed, or when an
        optional config file exists but is malformed.
        """
        root = Path(directory)
        path = root / TOKENIZER_FILE
        if not path.is_file():
            raise FrontendError("file not found", path)
        try:
            backend = RustTokenizer.from_file(str(path))
        except Exception as error:  # tokenizers raises a bare Exception on bad JSON or a bad model
            raise FrontendError(f"not a valid tokenizers file ({error})", path) from error
        return cls(backend, _stop_token_ids(root, backend), source=root)

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Ids that end generation, in configuration order."""
        return self._eos_token_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of added tokens marked special (what skip_special_tokens drops)."""
        return self._special_ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; added tokens written in the text become their ids. Pure."""
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD. Pure."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def special_token_id(self, name: str) -> int:
        """The id of the added token spelled `name` (e.g. "<|im_end|>"). Raises KeyError if there is none."""
        try:
            return self._added_ids[name]
        except KeyError:
            raise KeyError(f"no added token {name!r} in this tokenizer") from None

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry or added token spelled exactly `token`, else None. Pure."""
        return self._backend.token_to_id(token)

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh streaming decoder over this tokenizer."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Streaming decode: `push(id)` returns the new text, never part of a UTF-8 character.

    Keeps every id pushed so far and two offsets into them: text of ids before `read_offset` has been
    returned, and `prefix_offset` starts a short window that is re-decoded to find the new text. A delta
    ending in U+FFFD (an incomplete character) is held back until a later token completes it, so both
    offsets always sit on character boundaries. `finish()` returns whatever is still held (U+FFFD for
    truly invalid bytes). Concatenating every delta and `finish()` equals `decode(all ids)`.
    Mutates itself; not thread-safe.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # ids before this are fully emitted and never decoded again
        self._read_offset = 0  # ids before this have had their text emitted

    def push(self, token_id: int) -> str:
        """Add one id; returns the text it completes (possibly ""). Mutates."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta

    def push_many(self, token_ids: Iterable[int]) -> str:
        """Add several ids; returns the concatenated deltas. Mutates."""
        return "".join(self.push(token_id) for token_id in token_ids)

    def finish(self) -> str:
        """The text still held back (an incomplete character becomes U+FFFD). Mutates: consumes it."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]

    @property
    def token_ids(self) -> list[int]:
        """Every id pushed so far (a copy)."""
        return list(self._ids)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)


def _stop_token_ids(root: Path, backend: RustTokenizer) -> list[int]:
    ids: list[int] = []
    for name in (GENERATION_CONFIG_FILE, CONFIG_FILE):
        document = read_json_file(root / name, required=False)
        if document is not None:
            ids.extend(_as_id_list(document.get("eos_token_id"), root / name))
    tokenizer_config = read_json_file(root / TOKENIZER_CONFIG_FILE, required=False)
    eos_name = _token_content((tokenizer_config or {}).get("eos_token"))
    if eos_name is not None:
        eos_id = backend.token_to_id(eos_name)
        if eos_id is not None:
            ids.append(eos_id)
    return ids


def _as_id_list(value: object, path: Path) -> list[int]:
    if value is None:
        return []
    if _is_plain_int(value):
        return [value]
    if isinstance(value, list) and all(_is_plain_int(item) for item in value):
        return list(value)
    raise FrontendError(f"eos_token_id must be an integer or a list of integers, got {value!r}", path)


def _token_content(value: object) -> str | None:
    """A token given as a string or as an AddedToken-style object {"content": ...}."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _is_plain_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
