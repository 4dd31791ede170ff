"""The thinking budget: the tracker's rule for reasoning tokens, and the engine forcing a
`</think>` spelled over several tokens (a vocabulary without the tag) the same way alone, in the
batch and across a prefill/decode handoff. (R1's single `</think>` token: test_r1_distill.py.)"""

from __future__ import annotations

import pytest

from inference import SamplingParams, Step
from inference.engine import Engine
from inference.sampling.thinking import ThinkingTracker
from tests.inference.engines import batched, engine_for

CLOSE = (7, 8, 9)  # a three-token `</think>` for the tracker alone


def follow(tracker: ThinkingTracker, texts: list[str]) -> list[bool]:
    return [tracker.push(text) for text in texts]


def test_tokens_inside_a_block_are_reasoning_and_its_tags_are_not() -> None:
    tracker = ThinkingTracker(CLOSE)
    assert follow(tracker, ["Hi", "<think>", "a", "b", "</think>", "ok"]) == [False, False, True, True, False, False]
    assert tracker.num_reasoning_tokens == 2 and not tracker.is_open


def test_a_tag_spelled_over_several_tokens_is_seen() -> None:
    tracker = ThinkingTracker(CLOSE, is_open=True)  # the prompt opened the block
    assert follow(tracker, ["x", "</", "think", ">", "y"]) == [True, True, True, False, False]
    assert follow(tracker, ["<th", "ink>", "z"]) == [False, False, True]
    assert tracker.num_reasoning_tokens == 4 and tracker.is_open


def test_the_budget_forces_the_tag_token_by_token_then_lets_the_model_go_on() -> None:
    tracker = ThinkingTracker(CLOSE, max_thinking_tokens=2, is_open=True)
    assert [tracker.forced_token(), tracker.push("a"), tracker.forced_token(), tracker.push("b")] == [
        None,
        True,
        None,
        True,
    ]
    forced = []
    for text in ["</", "think", ">"]:
        forced.append(tracker.forced_token())
        assert tracker.push(text, is_forced=True) is False
    assert forced == list(CLOSE) and tracker.forced_token() is None and tracker.ended_by_budget
    assert not tracker.is_open and tracker.num_reasoning_tokens == 2


def test_a_later_block_is_closed_at_once_when_the_budget_is_spent() -> None:
    tracker = ThinkingTracker((5,), max_thinking_tokens=0)
    assert tracker.forced_token() is None  # no block is open: nothing to end
    tracker.push("<think>")
    assert tracker.forced_token() == 5


def test_max_thinking_tokens_is_validated_naming_the_value() -> None:
    assert SamplingParams(max_thinking_tokens=0).max_thinking_tokens == 0
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match=f"max_thinking_tokens={bad!r}|max_thinking_tokens={bad}"):
            SamplingParams(max_thinking_tokens=bad)
    with pytest.raises(ValueError, match="max_thinking_tokens=4 does not apply to beam search"):
        SamplingParams(max_thinking_tokens=4, num_beams=2)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return engine_for("llama")


def open_prompt(engine: Engine) -> list[int]:
    return engine.prompts.encode("Question: 2+2?\n<think>\n")


def steps_of(events: list) -> list[Step]:
    return [e for e in events if isinstance(e, Step)]


def test_a_vocabulary_without_the_tag_gets_its_token_sequence_alone_and_in_the_batch(engine: Engine) -> None:
    close_ids = engine.prompts.encode("</think>")
    assert engine.vocab.think_close_ids == tuple(close_ids) and len(close_ids) == 8  # one byte per token
    params = SamplingParams(max_new_tokens=14, greedy=True, ignore_eos=True, max_thinking_tokens=3)
    alone = list(engine.generate(open_prompt(engine), params))
    steps = steps_of(alone)
    assert [s.token_id for s in steps[3:11]] == close_ids and all(s.is_forced for s in steps[3:11])
    assert [s.is_reasoning for s in steps] == [True] * 3 + [False] * 11
    assert not any(s.is_forced for s in steps[:3] + steps[11:])
    assert "".join(s.text_delta for s in steps[3:11]) == "</think>"
    assert alone[-1].num_reasoning_tokens == 3 and alone[-1].thinking_ended_by_budget
    in_batch = batched(engine, open_prompt(engine), params)
    assert [(s.token_id, s.is_reasoning, s.is_forced) for s in steps_of(in_batch)] == [
        (s.token_id, s.is_reasoning, s.is_forced) for s in steps
    ]
    assert (in_batch[-1].num_reasoning_tokens, in_batch[-1].thinking_ended_by_budget) == (3, True)


def test_budget_zero_forces_the_first_token_and_a_handoff_continues_the_tag(engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=10, greedy=True, ignore_eos=True, max_thinking_tokens=0)
    alone = steps_of(engine.generate(open_prompt(engine), params))
    assert alone[0].phase == "prefill" and alone[0].is_forced and not any(s.is_reasoning for s in alone)
    handoff = engine.import_handoff(engine.export_handoff(engine.prefill_for_handoff(open_prompt(engine), params)))
    resumed = list(engine.generate(open_prompt(engine), params, handoff=handoff))
    assert [(s.token_id, s.is_forced) for s in steps_of(resumed)] == [(s.token_id, s.is_forced) for s in alone]
    assert resumed[-1].num_reasoning_tokens == 0 and resumed[-1].thinking_ended_by_budget


def test_without_an_open_block_nothing_is_reasoning_or_forced(engine: Engine) -> None:
    params = SamplingParams(max_new_tokens=6, greedy=True, ignore_eos=True, max_thinking_tokens=0)
    events = list(engine.generate(engine.prompts.encode("Question: 2+2?\n"), params))
    assert not any(s.is_reasoning or s.is_forced for s in steps_of(events))
    assert (events[-1].num_reasoning_tokens, events[-1].thinking_ended_by_budget) == (0, False)
