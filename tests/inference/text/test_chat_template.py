"""inference.text.chat_template: identical text to transformers, spans, validation, reasoning."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference.models.tiny import make_tiny_tokenizer
from inference.text.chat_template import (
    ChatTemplateError,
    RenderedPrompt,
    TemplateTokens,
    render_chat,
    validate_messages,
    validate_template,
)
from inference.text.reasoning import prompt_opens_reasoning, segments_for_browser, split_reasoning, split_segments

TEMPLATES = Path(__file__).parent / "chat_templates"

CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Why is the sky blue?"}],
    [
        {"role": "system", "content": "  Padded system prompt.\n"},
        {"role": "user", "content": "Line one\nline two <|im_start|> with a special string"},
        {"role": "assistant", "content": "<think>\nThe user wants...\n</think>\n\nHere you go 👋"},
        {"role": "user", "content": "  and accents: café, naïve, 世界  "},
    ],
    [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "empty question?"},
        {"role": "user", "content": "\n"},
    ],
]


def real_template_tokenizers() -> dict[str, object]:
    """Tokenizers carrying real published templates and their special tokens."""
    return {
        "llama3.2": make_tiny_tokenizer(
            ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
            eos_token="<|eot_id|>",
            chat_template=(TEMPLATES / "llama3_2_instruct.jinja").read_text(),
        ),
        "deepseek-r1": make_tiny_tokenizer(
            ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"],
            eos_token="<｜end▁of▁sentence｜>",
            chat_template=(TEMPLATES / "deepseek_r1_distill_llama.jinja").read_text(),
        ),
        "qwen3": make_tiny_tokenizer(
            ["<|endoftext|>", "<|im_end|>", "<|im_start|>", "<think>", "</think>"],
            eos_token="<|im_end|>",
            chat_template=(TEMPLATES / "qwen3.jinja").read_text(),
        ),
    }


def render_like(tokenizer, messages, add_generation_prompt: bool = True, **extra) -> RenderedPrompt:
    return render_chat(
        messages,
        tokenizer.chat_template,
        special_tokens=TemplateTokens.from_tokenizer(tokenizer),
        add_generation_prompt=add_generation_prompt,
        **extra,
    )


def assert_spans_tile(prompt: RenderedPrompt) -> None:
    """Spans cover the text in order, without gaps, overlap or empty spans."""
    assert prompt.spans[0].start == 0 and prompt.spans[-1].end == len(prompt.text)
    for span, following in zip(prompt.spans, prompt.spans[1:]):
        assert span.end == following.start
    assert all(s.end > s.start and s.kind in ("special", "role", "content") for s in prompt.spans)


def spans_of(prompt: RenderedPrompt) -> list[tuple[str, str, str | None]]:
    return [(prompt.text[s.start : s.end], s.kind, s.role) for s in prompt.spans]


# --- identical to apply_chat_template ------------------------------------------------------


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_bundled_template_matches_transformers(bundled, messages, add_generation_prompt: bool) -> None:
    expected = bundled.tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    prompt = render_like(bundled.tokenizer, messages, add_generation_prompt)
    assert prompt.text == expected
    assert_spans_tile(prompt)


@pytest.mark.parametrize("name", ["llama3.2", "deepseek-r1", "qwen3"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_real_templates_match_transformers(name: str, messages, add_generation_prompt: bool) -> None:
    tokenizer = real_template_tokenizers()[name]
    extra = {"date_string": "26 Jul 2024"}  # Llama 3.2 otherwise prints today's date
    expected = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )
    prompt = render_like(tokenizer, messages, add_generation_prompt, **extra)
    assert prompt.text == expected
    assert_spans_tile(prompt)


def test_extra_variables_reach_the_template() -> None:
    tokenizer = real_template_tokenizers()["qwen3"]
    messages = CONVERSATIONS[0]
    expected = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    prompt = render_like(tokenizer, messages, enable_thinking=False)
    assert prompt.text == expected and prompt.text.endswith("<think>\n\n</think>\n\n")


def test_strftime_now_is_available() -> None:
    prompt = render_like(real_template_tokenizers()["llama3.2"], CONVERSATIONS[0])
    assert re.search(r"Today Date: \d{2} \w{3} \d{4}\n", prompt.text)


def test_generation_tag_renders_its_body() -> None:
    template = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}A: {{ m.content }}"
        "{% endgeneration %}{% else %}U: {{ m.content }}{% endif %}\n{% endfor %}"
    )
    tokenizer = make_tiny_tokenizer(chat_template=template)
    messages = CONVERSATIONS[3]
    assert render_like(tokenizer, messages).text == tokenizer.apply_chat_template(messages, tokenize=False)


def test_tojson_keeps_html_and_unicode_like_transformers() -> None:
    template = "{{ messages[0] | tojson }}|{{ messages | tojson(indent=2) }}"
    tokenizer = make_tiny_tokenizer(chat_template=template)
    messages = [{"role": "user", "content": '<b>café</b> & "quotes"'}]
    text = render_like(tokenizer, messages).text
    assert text == tokenizer.apply_chat_template(messages, tokenize=False)
    assert "<b>café</b> &" in text


# --- spans ---------------------------------------------------------------------------------


def test_chatml_spans(bundled) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"}]
    prompt = render_like(bundled.tokenizer, messages)
    assert spans_of(prompt) == [
        ("<|im_start|>", "special", "system"),
        ("system\n", "role", "system"),
        ("Be brief.", "content", "system"),
        ("<|im_end|>", "special", "user"),
        ("\n", "role", "user"),
        ("<|im_start|>", "special", "user"),
        ("user\n", "role", "user"),
        # a special-token string typed by the user is still one special token to the model
        ("Hi ", "content", "user"),
        ("<|im_end|>", "special", "user"),
        (" there", "content", "user"),
        ("<|im_end|>", "special", "assistant"),
        ("\n", "role", "assistant"),
        ("<|im_start|>", "special", "assistant"),
        ("assistant\n", "role", "assistant"),
    ]
    assert prompt.to_dict()["spans"][0] == {"start": 0, "end": len("<|im_start|>"), "kind": "special", "role": "system"}


def test_contents_rewritten_by_the_template_still_get_spans() -> None:
    tokenizers = real_template_tokenizers()
    messages = CONVERSATIONS[2]
    llama = render_like(tokenizers["llama3.2"], messages)  # trims every content
    contents = [(t, role) for t, kind, role in spans_of(llama) if kind == "content"]
    assert contents == [
        ("Padded system prompt.", "system"),
        ("Line one\nline two <|im_start|> with a special string", "user"),
        ("<think>\nThe user wants...\n</think>\n\nHere you go 👋", "assistant"),
        ("and accents: café, naïve, 世界", "user"),
    ]
    r1 = render_like(tokenizers["deepseek-r1"], messages)  # drops the reasoning of earlier turns
    assert ("\n\nHere you go 👋", "content", "assistant") in spans_of(r1)
    assert r1.text.endswith("<｜Assistant｜><think>\n")
    assert spans_of(r1)[-1] == ("<think>\n", "role", "assistant")


def test_spans_without_generation_prompt_end_with_the_last_role(bundled) -> None:
    prompt = render_like(bundled.tokenizer, CONVERSATIONS[0], add_generation_prompt=False)
    assert spans_of(prompt)[-2:] == [("<|im_end|>", "special", "user"), ("\n", "role", "user")]


def test_a_template_that_inspects_content_still_gets_tiling_spans() -> None:
    template = (
        "{% for m in messages %}{% if m.content == 'secret' %}[hidden]{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    tokenizer = make_tiny_tokenizer(chat_template=template)
    prompt = render_like(tokenizer, [{"role": "user", "content": "secret"}, {"role": "user", "content": "<|eos|>"}])
    assert prompt.text == "[hidden]<|eos|>"
    assert [(text, kind) for text, kind, _ in spans_of(prompt)] == [("[hidden]", "content"), ("<|eos|>", "special")]


def test_a_template_that_slices_content_falls_back_to_roleless_spans() -> None:
    tokenizer = make_tiny_tokenizer(chat_template="{{ messages[0].content[0] }}|{{ messages[0].content }}<|eos|>")
    prompt = render_like(tokenizer, [{"role": "user", "content": "xy"}])
    assert spans_of(prompt) == [("x|xy", "content", None), ("<|eos|>", "special", None)]


# --- validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "messages, fragment",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        (["hello"], "messages[0] must be an object"),
        ([{"role": "robot", "content": "x"}], "messages[0].role='robot'"),
        ([{"role": "user"}], "messages[0].content must be a string"),
        ([{"role": "user", "content": "a"}, {"role": "user", "content": None}], "messages[1].content"),
        ([{"role": "user", "content": "a", "name": "bob"}], "unknown field(s): name"),
    ],
)
def test_bad_messages_are_rejected(messages, fragment: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)):
        render_chat(messages, "{{ messages }}")


def test_validate_messages_copies() -> None:
    original = [{"role": "user", "content": "x"}]
    copy = validate_messages(original)
    copy[0]["content"] = "changed"
    assert original[0]["content"] == "x"


def test_render_variables_cannot_be_shadowed() -> None:
    with pytest.raises(ValueError, match="documents"):
        render_chat(CONVERSATIONS[0], "{{ messages }}", documents=[])


def test_tools_render_as_apply_chat_template_renders_them() -> None:
    """Qwen2.5's template with `tools` (issue 50): its tools section, an earlier call written as the
    model writes it (the API stores it so) and a tool's result, equal to transformers' render of
    the same chat with structured `tool_calls`."""
    template = (TEMPLATES / "qwen2_5.jinja").read_text()
    tokenizer = make_tiny_tokenizer(("<|im_start|>", "<|im_end|>"), chat_template=template)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather now.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    question, result = {"role": "user", "content": "Paris?"}, {"role": "tool", "content": '{"celsius": 21}'}
    as_text = {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    structured = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]}
    expected = tokenizer.apply_chat_template(
        [question, structured, result], tools=tools, tokenize=False, add_generation_prompt=True
    )
    prompt = render_like(tokenizer, [question, as_text, result], tools=tools)
    assert prompt.text == expected and "# Tools" in expected and "<tool_response>" in expected
    assert_spans_tile(prompt)


def test_template_variables_must_be_plain_data() -> None:
    render_chat(CONVERSATIONS[0], "{{ opts.flags[0] }}", opts={"flags": [True, 1.5, None, "x"]})
    with pytest.raises(ValueError, match=r"template variable opts holds a \w*Path"):
        render_chat(CONVERSATIONS[0], "{{ opts }}", opts={"where": Path("/")})


def test_validate_template_renders_a_sample() -> None:
    text = validate_template((TEMPLATES / "qwen3.jinja").read_text())
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert text.endswith("<|im_start|>assistant\n")


def test_validate_template_retries_without_a_system_message() -> None:
    strict = (
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant') }}{% endif %}"
        "[{{ m.role }}]{{ m.content }}{% endfor %}"
    )
    assert validate_template(strict).startswith("[user]Hello!")


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("ok\n{% for m in messages %}{{ m.content }", "syntax error on line 2"),
        ("{% if %}", "syntax error on line 1"),
        ("", "empty"),
        ("{{ undefined_thing.attribute }}", "undefined value"),
        ("{{ raise_exception('nope') }}", "the template raised an error on line 1: nope"),
        ("{{ ''.__class__ }}", "sandbox"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "sandbox"),
        ("{{ messages.__class__.__base__ }}", "sandbox"),
        ("{{ cycler.__init__.__globals__ }}", "sandbox"),
        ("{% set ns = namespace() %}{% set ns._x = 1 %}", "sandbox"),
        ("{{ messages.append(1) }}", "sandbox"),
        ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ],
)
def test_validate_template_errors_are_readable(source: str, fragment: str) -> None:
    with pytest.raises(ChatTemplateError, match=re.escape(fragment)):
        validate_template(source)


# --- reasoning -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, starts_in_reasoning, expected",
    [
        ("<think>\nLet me see.\n</think>\n\nParis.", False, ("Let me see.", "Paris.")),
        ("<think>Still thinking", False, ("Still thinking", "")),
        ("Plain answer.", False, ("", "Plain answer.")),
        ("reasoning so far", True, ("reasoning so far", "")),
        ("hidden start\n</think>\n\nAnswer", False, ("hidden start", "Answer")),
        ("hidden start\n</think>\n\nAnswer", True, ("hidden start", "Answer")),
        ("", True, ("", "")),
    ],
)
def test_split_reasoning(text: str, starts_in_reasoning: bool, expected: tuple[str, str]) -> None:
    assert split_reasoning(text, starts_in_reasoning=starts_in_reasoning) == expected


def test_prompt_opens_reasoning() -> None:
    r1 = render_like(real_template_tokenizers()["deepseek-r1"], CONVERSATIONS[0])
    assert prompt_opens_reasoning(r1.text)
    closed = render_like(real_template_tokenizers()["qwen3"], CONVERSATIONS[0], enable_thinking=False)
    assert not prompt_opens_reasoning(closed.text)


def test_split_segments_gives_blocks_and_answer_runs_with_offsets() -> None:
    text = "Hi <think>a</think> mid <think>b"
    assert [(s.kind, text[s.start : s.end], s.is_open) for s in split_segments(text)] == [
        ("answer", "Hi ", False),
        ("reasoning", "a", False),
        ("answer", " mid ", False),
        ("reasoning", "b", True),
    ]


def test_segments_for_browser_count_utf16_units() -> None:
    text = "<think>\U0001f600x</think>y"  # the emoji is two UTF-16 units
    assert segments_for_browser(text) == [
        {"kind": "reasoning", "start": 7, "end": 10, "is_open": False},
        {"kind": "answer", "start": 18, "end": 19, "is_open": False},
    ]
