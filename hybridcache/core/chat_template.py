"""A checkpoint's chat template, rendered with a sandboxed jinja2 environment the way HF templates expect.

`ChatTemplate.from_dir(dir)` takes `chat_template.jinja` if present, else the `chat_template` field of
`tokenizer_config.json` (a string, or a list of named templates of which "default" is used).
`render(messages, tools, add_generation_prompt, **kwargs)` passes the template its own variables
(messages, tools, add_generation_prompt, enable_thinking, ...) plus `bos_token`/`eos_token` and the
helpers HF templates call: `raise_exception`, `strftime_now`, and a `tojson` filter that keeps non-ASCII
text as is. Errors raise `FrontendError` (from hybridcache.core.tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hybridcache.core.tokenizer import TOKENIZER_CONFIG_FILE, FrontendError, read_json_file

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class TemplateRaised(Exception):
    """What the template's `raise_exception(message)` throws; surfaces as a FrontendError."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _strftime_now(format_string: str) -> str:
    return datetime.now().strftime(format_string)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators=None,
    sort_keys: bool = False,
) -> str:
    """JSON text of `value` without HTML escaping (jinja2's own tojson escapes <, >, & and ')."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def make_environment() -> ImmutableSandboxedEnvironment:
    """A fresh sandboxed environment with HF's template conventions (trim_blocks, lstrip_blocks,
    loop controls, raise_exception, strftime_now, tojson). Pure: builds a new object each call."""
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=False,
        extensions=["jinja2.ext.loopcontrols"],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


class ChatTemplate:
    """A compiled chat template and the special tokens it may reference. Immutable; thread-safe."""

    def __init__(
        self, source: str, special_tokens: Mapping[str, str] | None = None, origin: Path | None = None
    ) -> None:
        """Compile `source`. Raises FrontendError (naming `origin`) on a template syntax error."""
        self.source = source
        self.origin = origin
        self._special_tokens = dict(special_tokens or {})
        try:
            self._template = make_environment().from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise FrontendError(
                f"chat template syntax error at line {error.lineno}: {error.message}", origin
            ) from error

    @classmethod
    def from_dir(cls, directory: str | Path) -> ChatTemplate:
        """The chat template of a checkpoint directory.

        Prefers chat_template.jinja; otherwise tokenizer_config.json's `chat_template`. Reads files.
        Raises FrontendError naming the file when neither holds a template, or a file is malformed.
        """
        root = Path(directory)
        tokenizer_config = read_json_file(root / TOKENIZER_CONFIG_FILE, required=False) or {}
        special_tokens = _special_token_strings(tokenizer_config)
        template_path = root / CHAT_TEMPLATE_FILE
        if template_path.is_file():
            try:
                source = template_path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise FrontendError(f"cannot be read ({error})", template_path) from error
            return cls(source, special_tokens, origin=template_path)
        config_path = root / TOKENIZER_CONFIG_FILE
        if "chat_template" not in tokenizer_config:
            raise FrontendError(
                f"no chat template: neither {CHAT_TEMPLATE_FILE} nor a chat_template field "
                f"in {TOKENIZER_CONFIG_FILE}",
                config_path,
            )
        return cls(
            _pick_template(tokenizer_config["chat_template"], config_path), special_tokens, origin=config_path
        )

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (dicts with role/content/...; OpenAI style tool_calls).

        Extra keyword arguments (enable_thinking, documents, ...) become template variables. Pure.
        Raises FrontendError when the template raises (unsupported role, bad content) or fails.
        """
        variables = {**self._special_tokens, **kwargs}
        try:
            return self._template.render(
                messages=list(messages),
                tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except TemplateRaised as error:
            raise FrontendError(f"chat template rejected the request: {error}") from error
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError) as error:
            raise FrontendError(f"chat template failed to render: {type(error).__name__}: {error}") from error


def _pick_template(value: object, path: Path) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {item.get("name"): item.get("template") for item in value if isinstance(item, dict)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise FrontendError("chat_template must be a string or a list of {name, template} with a 'default'", path)


def _special_token_strings(tokenizer_config: Mapping[str, Any]) -> dict[str, str]:
    """bos_token / eos_token / pad_token / unk_token as plain strings, for templates that print them."""
    tokens = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = tokenizer_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            tokens[key] = value
    return tokens
