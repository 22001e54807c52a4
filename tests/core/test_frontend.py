"""The frontend: chat rendering to tokens, chained block hashes under the salt, and tap hints."""

from pathlib import Path

import pytest

from hybridcache.cache.hashing import block_hashes
from hybridcache.cache.tap_planner import HintKind
from hybridcache.core.frontend import Frontend, salt_key
from hybridcache.core.tokenizer import FrontendError


@pytest.fixture(scope="module")
def frontend(micro_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(micro_checkpoint, max_model_len=8192)


CONVERSATION = [
    {"role": "system", "content": "You are a careful assistant. " * 4},
    {"role": "user", "content": "Summarise the plot of a long novel in three sentences, please."},
    {"role": "assistant", "content": "It begins. It continues. It ends."},
    {"role": "user", "content": "Now in one sentence."},
]


def hints_of(prompt, kind: HintKind) -> list[int]:
    return [position for position, hint in prompt.tap_hints if hint == kind]


def message_starts(frontend: Frontend, prompt) -> list[int]:
    start = frontend.tokenizer.token_to_id("<|im_start|>")
    return [i for i, token in enumerate(prompt.token_ids) if token == start]


def test_chat_prompts_tokenize_the_rendered_template(frontend: Frontend):
    prompt = frontend.prepare_chat(CONVERSATION)
    assert list(prompt.token_ids) == frontend.tokenizer.encode(frontend.render_chat(CONVERSATION))


def test_block_hashes_chain_every_full_block(frontend: Frontend):
    prompt = frontend.prepare_chat(CONVERSATION * 3)
    assert len(prompt.block_hashes) == prompt.num_tokens // 64 > 0
    assert list(prompt.block_hashes) == block_hashes(prompt.token_ids)
    assert prompt.extra_key == 0


def test_a_cache_salt_changes_every_block_identity(frontend: Frontend):
    plain = frontend.prepare_chat(CONVERSATION * 3)
    salted = frontend.prepare_chat(CONVERSATION * 3, cache_salt="tenant-a")
    other = frontend.prepare_chat(CONVERSATION * 3, cache_salt="tenant-b")
    assert salted.token_ids == plain.token_ids
    assert salted.extra_key == salt_key("tenant-a") != 0
    assert not set(salted.block_hashes) & set(plain.block_hashes)
    assert not set(salted.block_hashes) & set(other.block_hashes)


def test_hints_mark_messages_the_system_block_and_the_opener(frontend: Frontend):
    prompt = frontend.prepare_chat(CONVERSATION)
    starts = message_starts(frontend, prompt)
    assert hints_of(prompt, HintKind.MESSAGE) == starts[1:]
    assert hints_of(prompt, HintKind.STRUCTURAL) == [starts[1]]
    assert hints_of(prompt, HintKind.OPENER) == [starts[-1]]


def test_no_structural_hint_without_a_system_block_or_tools(frontend: Frontend):
    prompt = frontend.prepare_chat(CONVERSATION[1:])
    assert hints_of(prompt, HintKind.STRUCTURAL) == []


def test_no_opener_without_a_generation_prompt(frontend: Frontend):
    prompt = frontend.prepare_chat(CONVERSATION, add_generation_prompt=False)
    assert hints_of(prompt, HintKind.OPENER) == []


def test_a_breakpoint_marks_the_end_of_its_message(frontend: Frontend):
    prompt = frontend.prepare_chat(CONVERSATION, breakpoints=[1])
    starts = message_starts(frontend, prompt)
    assert hints_of(prompt, HintKind.EXPLICIT) == [starts[2]]  # where message 2 begins


def test_bad_requests_raise_frontend_errors(frontend: Frontend):
    with pytest.raises(FrontendError, match="empty"):
        frontend.prepare_chat([])
    with pytest.raises(FrontendError, match="breakpoint"):
        frontend.prepare_chat(CONVERSATION, breakpoints=[9])
    with pytest.raises(FrontendError, match="outside the vocabulary"):
        frontend.prepare_tokens([1, 2, 10**9])


def test_token_and_text_prompts_are_prepared_as_given(frontend: Frontend):
    tokens = frontend.tokenizer.encode("plain text prompt")
    assert list(frontend.prepare_tokens(tokens).token_ids) == tokens
    assert list(frontend.prepare_text("plain text prompt").token_ids) == tokens
    assert frontend.prepare_text("x", prefix_reuse=False).prefix_reuse is False
