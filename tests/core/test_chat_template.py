"""Our Qwen3.5 chat template renders the token layout Qwen3.5 expects: turns between <|im_start|> and
<|im_end|>, reasoning kept only after the last user query, JSON tool calls, tool results in user turns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridcache.core.chat_template import ChatTemplate
from hybridcache.core.tokenizer import FrontendError, Tokenizer
from hybridcache.tools.make_tiny_model import chat_template_source, ensure_checkpoint

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city <today> & tomorrow",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


# ---- factories ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def micro_dir(tmp_path_factory) -> Path:
    return ensure_checkpoint(tmp_path_factory.getbasetemp() / "checkpoints" / "micro-0", "micro", seed=0)


@pytest.fixture(scope="session")
def template(micro_dir) -> ChatTemplate:
    return ChatTemplate.from_dir(micro_dir)


@pytest.fixture(scope="session")
def tokenizer(micro_dir) -> Tokenizer:
    return Tokenizer.from_dir(micro_dir)


def system(text: str) -> dict:
    return {"role": "system", "content": text}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str, reasoning: str | None = None, tool_calls: list | None = None) -> dict:
    message: dict = {"role": "assistant", "content": text}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return message


def tool_call(name: str, arguments: dict | str) -> dict:
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_result(text: str) -> dict:
    return {"role": "tool", "tool_call_id": "call_x", "content": text}


def layout(tokenizer: Tokenizer, text: str) -> list[str]:
    """The rendered prompt as the model sees it: added tokens alone, plain text runs between them."""
    added = {tokenizer.special_token_id(name): name for name in ADDED_NAMES}
    pieces: list[str] = []
    run: list[int] = []
    for token_id in tokenizer.encode(text):
        if token_id in added:
            if run:
                pieces.append(tokenizer.decode(run))
                run = []
            pieces.append(added[token_id])
        else:
            run.append(token_id)
    if run:
        pieces.append(tokenizer.decode(run))
    return pieces


ADDED_NAMES = (
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)


def checkpoint_without_jinja(source: Path, destination: Path) -> Path:
    destination.mkdir()
    (destination / "tokenizer_config.json").write_bytes((source / "tokenizer_config.json").read_bytes())
    return destination


# ---- stories -----------------------------------------------------------------------------------------


def test_system_and_user_render_as_two_turns_and_open_a_thinking_answer(template, tokenizer):
    prompt = template.render([system("Be brief."), user("Hi!")])
    assert layout(tokenizer, prompt) == [
        "<|im_start|>",
        "system\nBe brief.",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "user\nHi!",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "assistant\n",
        "<think>",
        "\n",
    ]


def test_enable_thinking_false_closes_an_empty_reasoning_block(template, tokenizer):
    prompt = template.render([user("Hi!")], enable_thinking=False)
    assert layout(tokenizer, prompt)[-6:] == [
        "<|im_start|>",
        "assistant\n",
        "<think>",
        "\n\n",
        "</think>",
        "\n\n",
    ]


def test_without_a_generation_prompt_the_render_ends_after_the_last_turn(template):
    assert template.render([user("Hi!")], add_generation_prompt=False) == "<|im_start|>user\nHi!<|im_end|>\n"


def test_earlier_reasoning_is_stripped_and_reasoning_after_the_last_query_is_kept(template, tokenizer):
    history = [
        user("2+2?"),
        assistant("4", reasoning="Add them."),
        user("And 3+3?"),
        assistant("6", reasoning="\nAdd again.\n"),
    ]
    prompt = template.render(history, add_generation_prompt=False)
    assert "Add them." not in prompt
    assert layout(tokenizer, prompt) == [
        "<|im_start|>",
        "user\n2+2?",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "assistant\n4",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "user\nAnd 3+3?",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "assistant\n",
        "<think>",
        "\nAdd again.\n",
        "</think>",
        "\n\n6",
        "<|im_end|>",
        "\n",
    ]


def test_reasoning_written_inline_in_the_content_is_parsed_out(template):
    inline = [
        user("a"),
        assistant("<think>\nfirst\n</think>\n\nA"),
        user("b"),
        assistant("<think>r</think>B"),
    ]
    explicit = [user("a"), assistant("A", reasoning="first"), user("b"), assistant("B", reasoning="r")]
    assert template.render(inline) == template.render(explicit)
    assert "first" not in template.render(inline)


def test_a_generated_answer_appended_to_its_prompt_re_renders_token_for_token(template, tokenizer):
    # The prefix cache depends on this: the next turn's prompt starts with this turn's prompt + output.
    history = [system("S"), user("Question?")]
    prompt = template.render(history)
    generated = "Let me think.\n</think>\n\nAnswer.<|im_end|>"
    next_turn = template.render([*history, assistant("Answer.", reasoning="Let me think."), user("More?")])
    assert next_turn.startswith(prompt[: -len("<think>\n")])  # the earlier turn loses its reasoning...
    follow_up = template.render(
        [*history, assistant("Answer.", reasoning="Let me think.")], add_generation_prompt=False
    )
    assert follow_up == prompt + generated + "\n"  # ...but the latest answer renders exactly as generated
    assert tokenizer.encode(follow_up)[: len(tokenizer.encode(prompt))] == tokenizer.encode(prompt)


def test_tools_are_listed_in_the_system_turn_as_json(template):
    prompt = template.render([system("Be brief."), user("Weather in Köln?")], tools=[WEATHER_TOOL])
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    listed = prompt.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(listed) == WEATHER_TOOL  # tojson: valid JSON, <, > and & not HTML-escaped
    assert "<today> & tomorrow" in listed
    assert prompt.count("<|im_start|>system") == 1


def test_tool_calls_and_results_render_as_qwen_does(template, tokenizer):
    conversation = [
        user("Weather in Köln and Bonn?"),
        assistant(
            "",
            reasoning="Two cities.",
            tool_calls=[
                tool_call("get_weather", {"city": "Köln"}),
                tool_call("get_weather", '{"city": "Bonn"}'),
            ],
        ),
        tool_result("12°C"),
        tool_result("rain"),
    ]
    prompt = template.render(conversation, tools=[WEATHER_TOOL])
    turns = layout(tokenizer, prompt.split("<|im_end|>\n", 2)[2])  # skip the system and user turns
    assert turns == [
        "<|im_start|>",
        "assistant\n",
        "<think>",
        "\nTwo cities.\n",
        "</think>",
        "\n\n",
        "<tool_call>",
        '\n{"name": "get_weather", "arguments": {"city": "Köln"}}\n',
        "</tool_call>",
        "\n",
        "<tool_call>",
        '\n{"name": "get_weather", "arguments": {"city": "Bonn"}}\n',
        "</tool_call>",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "user\n",
        "<tool_response>",
        "\n12°C\n",
        "</tool_response>",
        "\n",
        "<tool_response>",
        "\nrain\n",
        "</tool_response>",
        "<|im_end|>",
        "\n",
        "<|im_start|>",
        "assistant\n",
        "<think>",
        "\n",
    ]


def test_an_answer_with_text_puts_each_tool_call_on_its_own_line(template):
    prompt = template.render(
        [user("q"), assistant("Checking.", tool_calls=[tool_call("f", {})])], add_generation_prompt=False
    )
    assert 'Checking.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>' in prompt


def test_text_content_parts_render_like_a_string(template):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]
    assert template.render(parts) == template.render([user("Hello")])


def test_unsupported_roles_and_content_raise_a_frontend_error(template):
    with pytest.raises(FrontendError, match="Unexpected message role: narrator"):
        template.render([{"role": "narrator", "content": "x"}])
    with pytest.raises(FrontendError, match="image"):
        template.render([{"role": "user", "content": [{"type": "image", "url": "x"}]}])
    with pytest.raises(FrontendError, match="No messages"):
        template.render([])


def test_the_template_falls_back_to_tokenizer_config(micro_dir, tmp_path):
    only_config = checkpoint_without_jinja(micro_dir, tmp_path / "ckpt")
    assert ChatTemplate.from_dir(only_config).source == chat_template_source()
    config = json.loads((only_config / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (only_config / "tokenizer_config.json").write_text(json.dumps(config))
    assert ChatTemplate.from_dir(only_config).render([user("x")]) == "D"


def test_a_missing_template_names_the_files_it_looked_for(micro_dir, tmp_path):
    only_config = checkpoint_without_jinja(micro_dir, tmp_path / "ckpt")
    config = json.loads((only_config / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (only_config / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(FrontendError, match=r"chat_template\.jinja") as raised:
        ChatTemplate.from_dir(only_config)
    assert raised.value.path == only_config / "tokenizer_config.json"


def test_a_malformed_template_or_config_names_the_file(tmp_path):
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(FrontendError, match=r"chat_template\.jinja.*syntax error at line 1"):
        ChatTemplate.from_dir(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{ not json")
    with pytest.raises(FrontendError, match=r"tokenizer_config\.json"):
        ChatTemplate.from_dir(tmp_path)


def test_the_sandbox_refuses_unsafe_attribute_access():
    sneaky = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(FrontendError):
        sneaky.render([user("x")])


def test_the_real_vocabulary_sees_single_token_turn_markers(tmp_path_factory):
    tiny_dir = ensure_checkpoint(tmp_path_factory.getbasetemp() / "checkpoints" / "tiny-0", "tiny", seed=0)
    tiny, template = Tokenizer.from_dir(tiny_dir), ChatTemplate.from_dir(tiny_dir)
    ids = tiny.encode(template.render([user("Hi")], enable_thinking=False))
    im_start, im_end = tiny.special_token_id("<|im_start|>"), tiny.special_token_id("<|im_end|>")
    assert ids[0] == im_start == 248045
    assert ids.count(im_start) == 2 and ids.count(im_end) == 1
    think, end_think = tiny.special_token_id("<think>"), tiny.special_token_id("</think>")
    empty_reasoning = [think, *tiny.encode("\n\n"), end_think]
    assert ids[-4:-1] == empty_reasoning
