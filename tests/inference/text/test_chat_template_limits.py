"""Chat templates are user code: one render is bounded in time and output size, and a
template that exceeds a bound is refused with a readable message (the issue's examples)."""

from __future__ import annotations

import sys
import time

import pytest

from inference.text import chat_template
from inference.text.chat_template import ChatTemplateError, render_chat, validate_template

MESSAGES = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("{{ 'x' * 10**7 }}", "repeating a value 10,000,000 times exceeds the limit"),
        ("{{ [1] * 10**7 }}", "repeating a value 10,000,000 times"),
        ("{{ 'x'|center(10**9) }}", "the argument 1,000,000,000 exceeds the limit"),
        ("{{ 'x'.ljust(10**9) }}", "the argument 1,000,000,000"),
        ("{{ '%999999999d' % 1 }}", "a width in the format string"),
        ("{{ '{:>999999999}'.format(1) }}", "a width in the format string"),
        ("{{ 7 ** 9999999 }}", "7 ** 9999999 exceeds the limit"),
        (
            "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "the concatenation exceeds the limit",
        ),
        ("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", "the rendered prompt exceeds the limit"),
        ("{{ range(200000)|list }}", "Range too big"),
    ],
)
def test_a_template_that_builds_too_much_is_refused_at_once(source: str, fragment: str) -> None:
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as refused:
        validate_template(source)
    assert "the template is too expensive" in str(refused.value) and fragment in str(refused.value)
    assert time.monotonic() - started < 1.5  # refused before building it, not after


@pytest.mark.parametrize(
    "source",
    [
        # The examples: a 150-million-iteration loop and a doubly nested range(100000).
        "{% for i in range(10000) %}{% for j in range(15000) %}{% endfor %}{% endfor %}ok",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% for i in range(100000) %}{% endfor %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    ],
)
def test_a_template_that_runs_too_long_is_stopped(source: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template, "MAX_RENDER_SECONDS", 0.5)
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as refused:
        render_chat(MESSAGES, source)
    assert time.monotonic() - started < 3
    message = str(refused.value)
    assert "the template is too expensive" in message
    assert "rendering took longer than 0.5 s" in message or "recursion" in message


def test_the_deadline_leaves_the_callers_tracer_in_place() -> None:
    calls: list[str] = []

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        calls.append(event)

    sys.settrace(tracer)
    try:
        render_chat(MESSAGES, "{% for m in messages %}{{ m.content }}{% endfor %}")
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)
    assert calls  # the caller's tracer still saw the frames outside the template


def test_real_templates_render_well_within_the_bounds() -> None:
    source = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    long_chat = [{"role": ("user", "assistant")[i % 2], "content": "word " * 400} for i in range(100)]
    started = time.monotonic()
    rendered = render_chat(long_chat, source)
    assert len(rendered.text) > 200_000 and time.monotonic() - started < 1.0
    assert validate_template("{{ 'ab' * 3 }}{{ '%5d' % 3 }}{{ '{:>4}'.format(1) }}") == "ababab    3   1"
