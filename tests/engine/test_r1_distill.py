"""A local R1-distill checkpoint (tiny Qwen2 / Llama with DeepSeek-R1-Distill's template and a
tokenizer holding the think tokens) loads through the lean runner with its own template: the
prompt opens `<think>`, earlier turns' reasoning is dropped, and the output starts as reasoning."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference import EngineConfig, SamplingParams, Step
from inference.engine import Engine
from inference.models.loader import load_model
from inference.text.chat_template import TemplateTokens, render_chat
from inference.text.reasoning import prompt_opens_reasoning, split_segments
from tests.engine.tiny_models import make_tiny_model, make_tiny_tokenizer

TEMPLATE = Path(__file__).with_name("chat_templates") / "deepseek_r1_distill_llama.jinja"
SPECIALS = ["<｜begin▁of▁sentence｜>", "<think>", "</think>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
HISTORY = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nOLD REASONING two and two\n</think>\n\nIt is 4."},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.fixture(params=["qwen2", "llama"])
def checkpoint(request, tmp_path: Path) -> Path:
    tokenizer = make_tiny_tokenizer(SPECIALS, eos_token=SPECIALS[-1], chat_template=TEMPLATE.read_text())
    make_tiny_model(request.param).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_r1_distill_prompt_and_reasoning(checkpoint: Path) -> None:
    loaded = load_model(EngineConfig(source=str(checkpoint), device="cpu", dtype="float32"))
    engine = Engine(loaded, EngineConfig(source=str(checkpoint)))
    assert engine.runner.name == "lean-llama"
    prompt = render_chat(HISTORY, loaded.chat_template, special_tokens=TemplateTokens.from_tokenizer(loaded.tokenizer))
    assert prompt.text.endswith("<｜Assistant｜><think>\n") and prompt_opens_reasoning(prompt.text)
    assert "OLD REASONING" not in prompt.text and "It is 4." in prompt.text  # R1 drops earlier reasoning
    ids = loaded.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    think_id = loaded.tokenizer.convert_tokens_to_ids("<think>")
    assert ids[-2:] == [think_id, ord("\n")]  # one token, not the tag's bytes
    events = list(engine.generate(ids, SamplingParams(max_new_tokens=5, greedy=True, ignore_eos=True)))
    text = "".join(e.text_delta for e in events if isinstance(e, Step))
    segments = split_segments(text, starts_in_reasoning=True)
    assert segments and segments[0].kind == "reasoning"  # the answer begins inside the opened block
