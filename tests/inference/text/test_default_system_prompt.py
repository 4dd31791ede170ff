"""The default system prompt a chat template injects: read off two renders, never guessed."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.text.default_system_prompt import default_system_prompt

TEMPLATES = Path(__file__).parent / "chat_templates"

# SmolLM2-Instruct's template: a conversation without a system turn gets this one.
INJECTING = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PLAIN = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}"
)


def test_an_injected_system_prompt_is_found() -> None:
    assert default_system_prompt(INJECTING) == "You are a helpful AI assistant named SmolLM"


@pytest.mark.parametrize("name", ["llama3_2_instruct.jinja", "qwen3.jinja", "deepseek_r1_distill_llama.jinja"])
def test_templates_that_add_no_system_prompt_give_none(name: str) -> None:
    # Llama 3.2 writes a date header into the system turn, but no system prompt.
    assert default_system_prompt((TEMPLATES / name).read_text()) is None


def test_a_template_without_a_system_turn_or_that_fails_gives_none() -> None:
    assert default_system_prompt(PLAIN) is None
    assert default_system_prompt("{{ raise_exception('no system role') }}") is None
    assert default_system_prompt("{% for %}") is None
