"""inference.sampling.beam: token-for-token and score equality with transformers' beam search on tiny
random models, the event stream a beam-tree view relies on, and the ways a search ends."""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from inference import SamplingParams
from inference.events import BeamStep, Finished, Prefilled
from inference.models.tiny import tiny_config
from inference.sampling.beam import ROOT_PARENT
from tests.inference.engines import engine_around

PROMPT = [1, 5, 9, 22, 7]
CONTEXT = 128  # the context limit beam_search is given; the models allow more


def make_model(arch: str):
    """A tiny random model with initializer_range=1: peaked next-token distributions, so beams
    are not separated by float noise (the default 0.02 makes near-ties everywhere)."""
    config = tiny_config(arch)
    config.initializer_range = 1.0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def model(request):
    return make_model(request.param)


@pytest.fixture(scope="module")
def llama():
    return make_model("llama")


def decode(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


class NamedIds:
    """A tokenizer stand-in whose text names each id ("t5 t9"): stop strings read it."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return decode(list(ids))

    def __len__(self) -> int:
        return len(self.tokenizer)

    def __getattr__(self, name: str):
        return getattr(self.tokenizer, name)


def run(model, params: SamplingParams, eos: int | None = None, max_length: int = CONTEXT, should_cancel=None) -> list:
    """The search through the engine's batch (the beams are sequences sharing KV blocks)."""
    engine = engine_around(model, eos_token_ids=() if eos is None else (eos,), max_context=max_length)
    engine.core.vocab = replace(engine.core.vocab, tokenizer=NamedIds(engine.vocab.tokenizer))
    return list(engine.generate(PROMPT, params, should_cancel=should_cancel))


def greedy_tokens(model, num_tokens: int) -> list[int]:
    out = model.generate(torch.tensor([PROMPT]), do_sample=False, max_new_tokens=num_tokens, pad_token_id=0)
    return out[0, len(PROMPT) :].tolist()


def transformers_beams(
    model, params: SamplingParams, eos: int, processors: list | None = None
) -> tuple[list[tuple[int, ...]], torch.Tensor]:
    out = model.generate(
        torch.tensor([PROMPT]),
        logits_processor=LogitsProcessorList(processors or []),
        do_sample=False,
        num_beams=params.num_beams,
        max_new_tokens=params.max_new_tokens,
        early_stopping=params.early_stopping,
        length_penalty=params.length_penalty,
        num_return_sequences=params.num_return_sequences,
        repetition_penalty=params.repetition_penalty,
        eos_token_id=eos,
        pad_token_id=eos,
        output_scores=True,
        return_dict_in_generate=True,
    )
    # beam_indices is -1 past each sequence's own end: it gives the generated length.
    lengths = (out.beam_indices != -1).sum(dim=1).tolist()
    sequences = [tuple(row[len(PROMPT) : len(PROMPT) + n].tolist()) for row, n in zip(out.sequences, lengths)]
    return sequences, out.sequences_scores


def assert_same_as_transformers(model, params: SamplingParams, eos: int) -> str:
    finished = run(model, params, eos)[-1]
    expected_sequences, expected_scores = transformers_beams(model, params, eos)
    assert [b.token_ids for b in finished.sequences] == expected_sequences, params
    assert torch.allclose(torch.tensor([b.score for b in finished.sequences]), expected_scores, atol=1e-5), params
    return finished.finish_reason


def test_equals_transformers_beam_search(model):
    # EOS = tokens greedy decoding emits early, so some searches end on EOS and others by length.
    eos_choices = greedy_tokens(model, 5)[2:5:2]
    reasons = set()
    grid = itertools.product(eos_choices, [2, 4], [False, True], [0.5, 1.0, 2.0], [False, True])
    for eos, num_beams, early_stopping, length_penalty, return_all in grid:
        params = SamplingParams(
            num_beams=num_beams,
            early_stopping=early_stopping,
            length_penalty=length_penalty,
            num_return_sequences=num_beams if return_all else 1,
            max_new_tokens=12,
        )
        reasons.add(assert_same_as_transformers(model, params, eos))
    assert reasons == {"eos", "length"}


@pytest.mark.parametrize("arch", ["qwen2", "deepseek_v3"])
def test_other_architectures_equal_transformers(arch):
    other = make_model(arch)
    params = SamplingParams(num_beams=3, num_return_sequences=3, max_new_tokens=10)
    assert_same_as_transformers(other, params, greedy_tokens(other, 5)[2])


@pytest.mark.parametrize("penalty", [0.8, 1.3])
def test_repetition_penalty_equals_transformers(model, penalty):
    eos = greedy_tokens(model, 4)[3]
    params = SamplingParams(num_beams=3, num_return_sequences=3, repetition_penalty=penalty, max_new_tokens=10)
    assert_same_as_transformers(model, params, eos)


def test_repetition_penalty_on_the_answer_only_equals_transformers_prompt_ignore_length(model, monkeypatch):
    # The model's own continuation inside the prompt: a penalty over the prompt then hits the
    # tokens the beams would pick, so the two settings must differ.
    monkeypatch.setattr(sys.modules[__name__], "PROMPT", PROMPT + greedy_tokens(model, 6))
    eos = greedy_tokens(model, 4)[3]
    params = SamplingParams(num_beams=3, num_return_sequences=3, repetition_penalty=1.3, max_new_tokens=10)
    answer_only = replace(params, penalize_prompt=False)
    penalty = RepetitionPenaltyLogitsProcessor(1.3, prompt_ignore_length=len(PROMPT))
    expected, expected_scores = transformers_beams(model, replace(params, repetition_penalty=1.0), eos, [penalty])
    finished = run(model, answer_only, eos)[-1]
    assert [b.token_ids for b in finished.sequences] == expected
    assert torch.allclose(torch.tensor([b.score for b in finished.sequences]), expected_scores, atol=1e-5)
    whole = run(model, params, eos)[-1]  # the prompt's tokens penalized too: other scores
    assert not torch.allclose(torch.tensor([b.score for b in whole.sequences]), expected_scores, atol=1e-3)


def test_without_kv_cache_same_result(llama):
    params = SamplingParams(num_beams=3, num_return_sequences=3, max_new_tokens=8)
    eos = greedy_tokens(llama, 4)[3]
    with_cache = run(llama, params, eos)[-1]
    without_cache = run(llama, replace(params, use_kv_cache=False), eos)[-1]
    assert [b.token_ids for b in without_cache.sequences] == [b.token_ids for b in with_cache.sequences]
    assert without_cache.kv_cache_bytes == 0 < with_cache.kv_cache_bytes


def test_event_stream_draws_a_consistent_tree(llama):
    params = SamplingParams(num_beams=3, num_return_sequences=2, max_new_tokens=10)
    eos = greedy_tokens(llama, 5)[2]
    events = run(llama, params, eos)
    prefilled, steps, finished = events[0], events[1:-1], events[-1]
    assert isinstance(prefilled, Prefilled) and isinstance(finished, Finished)
    assert prefilled.num_prompt_tokens == prefilled.num_prefilled_tokens == len(PROMPT)
    assert all(isinstance(s, BeamStep) for s in steps)
    assert [s.index for s in steps] == list(range(len(steps)))
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * (len(steps) - 1)
    assert all(b.parent == ROOT_PARENT and len(b.token_ids) == 1 for b in steps[0].beams)
    for previous, step in zip(steps, steps[1:]):
        live = [b for b in previous.beams if not b.is_finished]
        for beam in step.beams:
            assert beam.token_ids[:-1] == live[beam.parent].token_ids
            assert beam.text == decode([t for t in beam.token_ids if t != eos])
    assert sum(not b.is_finished for b in steps[0].beams) == 3
    assert any(b.is_finished for s in steps for b in s.beams)
    assert finished.token_ids == finished.sequences[0].token_ids
    assert finished.num_generated_tokens == len(finished.token_ids)
    assert len(finished.sequences) == 2
    assert finished.sequences[0].score >= finished.sequences[1].score
    assert finished.kv_cache_bytes > prefilled.kv_cache_bytes > 0
    assert finished.num_prompt_tokens == len(PROMPT) and finished.num_cached_tokens == 0


def test_finished_text_leaves_out_eos(llama):
    eos = greedy_tokens(llama, 2)[1]
    finished = run(llama, SamplingParams(num_beams=2, max_new_tokens=6, length_penalty=0.0), eos)[-1]
    assert finished.finish_reason == "eos"
    assert finished.token_ids[-1] == eos
    assert finished.text == decode(list(finished.token_ids[:-1]))


def test_should_cancel_cancels_after_that_step(llama):
    calls = []
    events = run(
        llama,
        SamplingParams(num_beams=2, max_new_tokens=20, ignore_eos=True),
        should_cancel=lambda: calls.append(1) or len(calls) >= 3,
    )
    assert sum(isinstance(e, BeamStep) for e in events) == 3
    finished = events[-1]
    assert finished.finish_reason == "cancelled"
    assert len(finished.token_ids) == 3


def test_ignore_eos_runs_to_max_new_tokens(llama):
    eos = greedy_tokens(llama, 2)[1]
    finished = run(llama, SamplingParams(num_beams=2, max_new_tokens=6, ignore_eos=True), eos)[-1]
    assert finished.finish_reason == "length"
    assert len(finished.token_ids) == 6


def test_context_limit_ends_the_search(llama):
    max_length = len(PROMPT) + 4
    finished = run(llama, SamplingParams(num_beams=2, max_new_tokens=50), max_length=max_length)[-1]
    assert finished.finish_reason == "context"
    assert len(finished.token_ids) == 4


def test_prompt_that_fills_the_context_is_a_value_error(llama):
    with pytest.raises(ValueError, match="5 tokens"):
        run(llama, SamplingParams(num_beams=2), max_length=len(PROMPT))


def test_stop_string_finishes_a_beam_and_is_cut_from_the_text(llama):
    first = greedy_tokens(llama, 1)[0]
    # length_penalty 0 scores hypotheses by summed logprob, so the 1-token hypothesis that hit
    # the stop string beats every longer one.
    params = SamplingParams(num_beams=2, max_new_tokens=8, length_penalty=0.0, stop=(f"t{first}",))
    finished = run(llama, params)[-1]
    assert finished.finish_reason == "stop_string"
    assert finished.token_ids == (first,)
    assert finished.text == ""
    assert all(f"t{first}" not in b.text for b in finished.sequences)


def test_token_logprobs_are_the_models_along_each_path(llama):
    params = SamplingParams(num_beams=3, num_return_sequences=3, max_new_tokens=8, length_penalty=2.0)
    events = run(llama, params, greedy_tokens(llama, 5)[2])
    for beam in events[-1].sequences + events[-2].beams:
        ids = torch.tensor([PROMPT + list(beam.token_ids)])
        with torch.no_grad():
            logprobs = torch.log_softmax(llama(ids).logits[0].float(), dim=-1)
        positions = range(len(PROMPT) - 1, len(PROMPT) - 1 + len(beam.token_ids))
        expected = [logprobs[p, t].item() for p, t in zip(positions, beam.token_ids)]
        assert beam.token_logprobs == pytest.approx(expected, abs=1e-4)
        assert beam.score == pytest.approx(sum(beam.token_logprobs) / len(beam.token_ids) ** 2.0, abs=1e-4)
