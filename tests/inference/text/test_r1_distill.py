"""A local R1-distill checkpoint (tiny Qwen2 / Llama with DeepSeek-R1-Distill's template and a
tokenizer holding the think tokens) loads through the lean runner with its own template: the
prompt opens `<think>`, earlier turns' reasoning is dropped, and the output starts as reasoning;
the thinking budget forces R1's single `</think>` token, the same way alone and in the batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference import EngineConfig, Finished, SamplingParams, Step
from inference.engine import Engine
from inference.models.loader import load_model
from inference.models.tiny import make_tiny_model, make_tiny_tokenizer
from inference.text.chat_template import TemplateTokens, render_chat
from inference.text.reasoning import prompt_opens_reasoning, split_segments
from tests.inference.engines import batched

TEMPLATE = Path(__file__).with_name("chat_templates") / "deepseek_r1_distill_llama.jinja"
SPECIALS = ["<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"]
THINK_TOKENS = ["<think>", "</think>"]  # added but not special in R1's tokenizers: decoded text keeps them
HISTORY = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nOLD REASONING two and two\n</think>\n\nIt is 4."},
    {"role": "user", "content": "And 3+3?"},
]


@pytest.fixture(params=["qwen2", "llama"])
def checkpoint(request, tmp_path: Path) -> Path:
    tokenizer = make_tiny_tokenizer(
        SPECIALS, eos_token=SPECIALS[-1], chat_template=TEMPLATE.read_text(), plain_tokens=THINK_TOKENS
    )
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
    assert prompt.dropped_reasoning == (1,)  # ... and the prompt says whose
    ids = loaded.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
    think_id = loaded.tokenizer.convert_tokens_to_ids("<think>")
    assert ids[-2:] == [think_id, ord("\n")]  # one token, not the tag's bytes
    events = list(engine.generate(ids, SamplingParams(max_new_tokens=5, greedy=True, ignore_eos=True)))
    text = "".join(e.text_delta for e in events if isinstance(e, Step))
    segments = split_segments(text, starts_in_reasoning=True)
    assert segments and segments[0].kind == "reasoning"  # the answer begins inside the opened block


@pytest.fixture
def r1_engine(checkpoint: Path) -> Engine:
    return Engine(load_model(EngineConfig(source=str(checkpoint), device="cpu", dtype="float32")), EngineConfig())


def r1_prompt(engine: Engine) -> list[int]:
    return engine.prompts.encode(engine.prompts.render_chat(HISTORY).text)


@pytest.mark.parametrize("budget", [0, 3])
def test_the_budget_forces_the_single_think_close_token_alone_and_in_the_batch(r1_engine: Engine, budget: int) -> None:
    engine, prompt_ids = r1_engine, r1_prompt(r1_engine)
    close_id = engine.loaded.tokenizer.convert_tokens_to_ids("</think>")
    assert engine.vocab.think_close_ids == (close_id,)
    params = SamplingParams(max_new_tokens=8, greedy=True, ignore_eos=True, max_thinking_tokens=budget)
    free = [e for e in engine.generate(prompt_ids, replace_budget(params, None)) if isinstance(e, Step)]
    assert close_id not in [s.token_id for s in free[: budget + 1]]  # the model would have gone on thinking
    alone = list(engine.generate(prompt_ids, params))
    steps, finished = [e for e in alone if isinstance(e, Step)], alone[-1]
    assert [s.is_reasoning for s in steps] == [True] * budget + [False] * (8 - budget)
    forced = steps[budget]
    assert forced.is_forced and forced.token_id == close_id and sum(s.is_forced for s in steps) == 1
    # The model still ran at the forced step: its distribution is the one the free run had there
    # (to float32 rounding: this run's prompt came from the prefix cache, one token computed).
    assert [a.token_id for a in forced.top_raw] == [a.token_id for a in free[budget].top_raw]
    assert [a.logprob for a in forced.top_raw] == pytest.approx([a.logprob for a in free[budget].top_raw], abs=1e-5)
    assert forced.raw_logprob <= free[budget].raw_logprob + 1e-5
    assert isinstance(finished, Finished) and finished.thinking_ended_by_budget
    assert finished.num_reasoning_tokens == budget == sum(s.is_reasoning for s in steps)
    assert "</think>" in finished.text
    in_batch = batched(engine, prompt_ids, params)
    assert [flags(e) for e in in_batch if isinstance(e, Step)] == [flags(s) for s in steps]  # logits agree closely
    assert (in_batch[-1].num_reasoning_tokens, in_batch[-1].thinking_ended_by_budget) == (budget, True)


def test_a_budget_larger_than_the_output_changes_nothing(r1_engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=6, greedy=True, ignore_eos=True)
    free = list(r1_engine.generate(r1_prompt(r1_engine), params))
    capped = list(r1_engine.generate(r1_prompt(r1_engine), replace_budget(params, 50)))
    assert [e.token_id for e in capped if isinstance(e, Step)] == [e.token_id for e in free if isinstance(e, Step)]
    assert not any(e.is_forced for e in capped if isinstance(e, Step))
    assert capped[-1].num_reasoning_tokens == free[-1].num_reasoning_tokens
    assert not capped[-1].thinking_ended_by_budget


def replace_budget(params: SamplingParams, budget: int | None) -> SamplingParams:
    return SamplingParams.from_dict({**params.to_dict(), "max_thinking_tokens": budget})


def flags(step: Step) -> tuple[int, str, bool, bool]:
    return step.token_id, step.text_delta, step.is_reasoning, step.is_forced
