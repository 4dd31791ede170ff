"""The generation loop against transformers, on the bundled model and tiny random models."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from transformers import LogitsProcessorList, RepetitionPenaltyLogitsProcessor

from inference import EngineConfig, Finished, Prefilled, SamplingParams, Step
from inference.core.scheduler import Chunk
from inference.core.sequence import Sequence
from inference.engine import Engine
from inference.models.runner import StepOutput
from inference.models.tiny import DENSE_SHAPE, TINY_VOCAB_SIZE
from tests.inference.engines import engine_for, hf_greedy, run

TINY_ARCHS = ["gpt2", "llama", "qwen2", "deepseek_v3"]
PROMPT = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def engine(bundled) -> Engine:
    return Engine(bundled, EngineConfig())


@pytest.fixture(scope="module")
def prompt_ids(engine) -> list[int]:
    return engine.prompts.encode(PROMPT)


# ---- equivalence with transformers --------------------------------------------------------


def test_penalize_prompt_off_equals_transformers_prompt_ignore_length(bundled, engine, prompt_ids):
    """The penalty over the answer's own tokens only is transformers' `prompt_ignore_length`; and
    it is not the penalty over the prompt too (the colours the prompt names are not penalized)."""
    penalty = RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=len(prompt_ids))
    expected = hf_greedy(bundled.model, prompt_ids, 24, bundled.eos_token_ids, LogitsProcessorList([penalty]))
    _, steps, _ = run(engine, prompt_ids, greedy=True, repetition_penalty=1.5, penalize_prompt=False, max_new_tokens=24)
    assert [s.token_id for s in steps] == expected
    _, whole, _ = run(engine, prompt_ids, greedy=True, repetition_penalty=1.5, max_new_tokens=24)
    assert [s.token_id for s in whole] != expected


@pytest.mark.parametrize("runner", ["auto", "transformers"])
def test_greedy_equals_transformers_generate_on_bundled_model(bundled, prompt_ids, runner):
    engine = Engine(bundled, EngineConfig(runner=runner))
    assert engine.runner.name == ("lean-llama" if runner == "auto" else "transformers")
    _, steps, finished = run(engine, prompt_ids, greedy=True, max_new_tokens=24)
    expected = hf_greedy(bundled.model, prompt_ids, 24, bundled.eos_token_ids)
    assert [s.token_id for s in steps] == expected
    assert list(finished.token_ids) == expected


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_greedy_equals_transformers_generate_on_tiny_models(arch):
    engine = engine_for(arch)
    prompt = [5, 77, 130, 9, 200, 41]
    _, steps, _ = run(engine, prompt, greedy=True, max_new_tokens=16, ignore_eos=True)
    assert [s.token_id for s in steps] == hf_greedy(engine.model, prompt, 16, ())


@pytest.mark.parametrize("arch,runner", [("llama", "lean-llama"), ("qwen2", "lean-llama"), ("gpt2", "transformers")])
def test_runner_logits_match_transformers_with_chunked_prefill(arch, runner):
    """A prompt in three passes over the paged pool: a prefill chunk, a chunk after a cached
    prefix (masked), one decode step: each pass's last logits equal transformers' at that position."""
    engine = engine_for(arch)
    assert engine.runner.name == runner
    ids = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
    with torch.inference_mode():
        expected = engine.model(torch.tensor([ids])).logits[0].float()  # (T, vocab)
    seq = Sequence(list(ids), SamplingParams())
    engine.core.block_manager.allocate(seq)
    for start, end in [(0, 6), (6, 9), (9, 10)]:
        got = engine.runner.run([Chunk(seq, start, end - start, True, "prefill")]).logits[0]
        torch.testing.assert_close(got, expected[end - 1], atol=1e-4, rtol=1e-4)


def test_cached_decode_equals_recompute_without_cache(engine, prompt_ids):
    _, cached, _ = run(engine, prompt_ids, greedy=True, max_new_tokens=12, num_alternatives=5)
    _, recomputed, fin = run(engine, prompt_ids, greedy=True, max_new_tokens=12, num_alternatives=5, use_kv_cache=False)
    assert [s.token_id for s in cached] == [s.token_id for s in recomputed]
    for a, b in zip(cached, recomputed):
        assert [x.token_id for x in a.top_raw] == [x.token_id for x in b.top_raw]
        for x, y in zip(a.top_raw, b.top_raw):
            assert math.isclose(x.logprob, y.logprob, abs_tol=1e-3)
    assert fin.kv_cache_bytes == 0 and cached[-1].kv_cache_bytes > 0


# ---- the records ------------------------------------------------------------------------


def test_event_sequence_and_step_records(engine, prompt_ids):
    events, steps, finished = run(
        engine, prompt_ids, temperature=0.8, top_k=20, seed=3, max_new_tokens=8, num_alternatives=10
    )
    assert isinstance(events[0], Prefilled) and events[0].num_prompt_tokens == len(prompt_ids)
    assert events[0].kv_cache_bytes == engine.info.kv_bytes_per_token * len(prompt_ids)
    assert isinstance(finished, Finished) and sum(isinstance(e, Finished) for e in events) == 1
    assert [s.phase for s in steps] == ["prefill"] + ["decode"] * (len(steps) - 1)
    for step in steps:
        assert len(step.top_raw) == 10 and len(step.top_processed) <= 10
        probs = [a.prob for a in step.top_raw]
        assert probs == sorted(probs, reverse=True) and sum(probs) <= 1.0 + 1e-5
        assert step.rank >= 1 and step.entropy >= 0 and step.latency_ms > 0
        # top-k=20 leaves at most 20 tokens, so the processed top list has no -inf members
        assert all(a.prob > 0 for a in step.top_processed)
        # temperature and top-k keep the raw order, so the chosen token is listed iff its raw rank <= 10
        assert (step.token_id in {a.token_id for a in step.top_processed}) == (step.rank <= 10)
        assert step.token_bytes == engine.prompts.table.bytes_of(step.token_id)
    assert finished.text == "".join(s.text_delta for s in steps)
    assert finished.num_generated_tokens == len(steps) and finished.ttft_ms >= finished.prefill_ms


def test_same_seed_same_tokens_and_other_seed_differs(engine, prompt_ids):
    def tokens(seed):
        return [s.token_id for s in run(engine, prompt_ids, temperature=1.2, seed=seed, max_new_tokens=20)[1]]

    assert tokens(7) == tokens(7)
    assert tokens(7) != tokens(8)


# ---- stops ------------------------------------------------------------------------------


def test_stops_on_any_eos_id(bundled, prompt_ids):
    first = run(Engine(bundled, EngineConfig()), prompt_ids, greedy=True, max_new_tokens=6)[1]
    # pretend the third token is an end-of-sequence id
    engine = Engine(replace(bundled, eos_token_ids=(999_999, first[2].token_id)), EngineConfig())
    _, steps, finished = run(engine, prompt_ids, greedy=True, max_new_tokens=6)
    assert len(steps) == 3 and finished.finish_reason == "eos"
    _, steps, finished = run(engine, prompt_ids, greedy=True, max_new_tokens=6, ignore_eos=True)
    assert len(steps) == 6 and finished.finish_reason == "length"


def test_stop_string_ends_text_before_it(engine, prompt_ids):
    full = run(engine, prompt_ids, greedy=True, max_new_tokens=24)[2].text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), full
    _, steps, finished = run(engine, prompt_ids, greedy=True, max_new_tokens=24, stop=(stop,))
    assert finished.finish_reason == "stop_string"
    assert finished.text == full[: full.find(stop)]
    assert "".join(s.text_delta for s in steps) == finished.text


def test_beam_sequences_carry_each_tokens_text(engine, prompt_ids):
    """A page shows a beam-search answer token by token from `text_deltas`: they add up to the
    answer, one per token, and a stop string is cut from them as from the text."""
    params = dict(num_beams=3, num_return_sequences=3, max_new_tokens=12)
    full = run(engine, prompt_ids, **params)[2]
    for beam in full.sequences:
        assert len(beam.text_deltas) == len(beam.token_ids)
        assert "".join(beam.text_deltas) == beam.text
        assert len(beam.token_logprobs) == len(beam.token_ids)
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 3]
    cut = run(engine, prompt_ids, **params, stop=(stop,))[2].sequences[0]
    assert "".join(cut.text_deltas) == cut.text and stop not in cut.text


def test_cancellation_is_checked_every_step(engine, prompt_ids):
    calls = []

    def should_cancel() -> bool:
        calls.append(1)
        return len(calls) >= 3

    events = list(engine.generate(prompt_ids, SamplingParams(greedy=True, max_new_tokens=50), should_cancel))
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) == 3 and events[-1].finish_reason == "cancelled"


def test_context_length_ends_generation(bundled, prompt_ids):
    engine = Engine(replace(bundled, max_context=len(prompt_ids) + 4), EngineConfig())
    _, steps, finished = run(engine, prompt_ids, greedy=True, max_new_tokens=50, ignore_eos=True)
    assert finished.finish_reason == "context" and len(steps) == 4
    with pytest.raises(ValueError, match="context"):
        list(engine.generate(prompt_ids * 2, SamplingParams()))


def test_utf8_split_across_tokens_streams_whole_characters(engine):
    text = "Tea 🍵 and 日本語, naïve 👩‍👩‍👧!"
    script = engine.prompts.encode(text)
    assert len(script) > len(text.split())  # multi-byte characters really are split over tokens
    real_run = engine.runner.run
    engine.runner.run = ScriptedRunner(script, len(engine.loaded.tokenizer))
    try:
        _, steps, finished = run(engine, [1, 2, 3], greedy=True, max_new_tokens=len(script), ignore_eos=True)
    finally:
        engine.runner.run = real_run
    assert [s.token_id for s in steps] == script
    assert all("\ufffd" not in s.text_delta for s in steps)
    assert "".join(s.text_delta for s in steps) == text == finished.text


# ---- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", -1.0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -3),
        ("min_p", 1.0),
        ("repetition_penalty", 0.0),
        ("max_new_tokens", 0),
        ("num_alternatives", 51),
        ("seed", -1),
        ("num_beams", 0),
        ("temperature", float("nan")),
        ("greedy", "yes"),
        ("stop", ("",)),
    ],
)
def test_invalid_sampling_params_name_the_value(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_unknown_setting_is_named():
    with pytest.raises(ValueError, match="tempreature"):
        SamplingParams.from_dict({"tempreature": 0.5})


def test_bad_prompts_are_clear_errors(engine):
    with pytest.raises(ValueError, match="empty"):
        list(engine.generate([], SamplingParams()))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        list(engine.generate([10**7], SamplingParams()))


def cuda_engine(bundled_model_dir) -> Engine:
    from inference.models.loader import load_model

    loaded = load_model(EngineConfig(source=str(bundled_model_dir), device="cuda", dtype="bfloat16"))
    return Engine(loaded, EngineConfig(device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_greedy_on_cuda_matches_transformers(bundled_model_dir):
    engine = cuda_engine(bundled_model_dir)
    loaded = engine.loaded
    ids = engine.prompts.encode(PROMPT)
    _, steps, _ = run(engine, ids, greedy=True, max_new_tokens=16)
    assert [s.token_id for s in steps] == hf_greedy(loaded.model, ids, 16, loaded.eos_token_ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_repetition_penalty_and_seeded_sampling_run_on_cuda(bundled_model_dir):
    """The penalty gathers logits (on CUDA) at the context ids: those must live there too."""
    engine = cuda_engine(bundled_model_dir)
    ids = engine.prompts.encode(PROMPT)
    _, steps, finished = run(engine, ids, repetition_penalty=1.3, temperature=0.8, seed=7, max_new_tokens=12)
    assert len(steps) == finished.num_generated_tokens > 0
    _, again, _ = run(engine, ids, repetition_penalty=1.3, temperature=0.8, seed=7, max_new_tokens=12)
    assert [s.token_id for s in again] == [s.token_id for s in steps]


class ScriptedRunner:
    """A fake forward pass (`ModelRunner.run`): its logits put all mass on the next token of a script."""

    def __init__(self, script: list[int], vocab_size: int) -> None:
        self.script, self.vocab_size, self.calls = script, vocab_size, 0

    def __call__(self, chunks, pixel_values=None) -> StepOutput:
        logits = torch.zeros(1, self.vocab_size)
        logits[0, self.script[min(self.calls, len(self.script) - 1)]] = 30.0
        self.calls += 1
        return StepOutput(logits=logits, routing=[None])


def tiny_mistral(sliding_window: int | None):
    from transformers import AutoModelForCausalLM, MistralConfig

    config = MistralConfig(vocab_size=TINY_VOCAB_SIZE, **DENSE_SHAPE, sliding_window=sliding_window)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


LONGER_THAN_THE_WINDOW = [5, 77, 130, 9, 200, 41, 17, 3, 99, 150, 12]


@pytest.mark.parametrize("sliding_window,runner", [(None, "lean-llama"), (8, "transformers")])
def test_mistral_uses_the_lean_runner_only_without_a_sliding_window(sliding_window, runner):
    model = tiny_mistral(sliding_window)
    engine = Engine(replace(engine_for("llama").loaded, model=model), EngineConfig())
    assert engine.runner.name == runner
    prompt = LONGER_THAN_THE_WINDOW  # it must matter
    _, steps, _ = run(engine, prompt, greedy=True, max_new_tokens=12, ignore_eos=True)
    assert [s.token_id for s in steps] == hf_greedy(model, prompt, 12, ())
    assert engine.model_info()["sliding_window"] == sliding_window


def test_a_sliding_window_conversation_is_reused_as_a_prefix():
    """The paged pool keeps every position (the window is a mask), so the next turn reuses it."""
    model = tiny_mistral(8)
    engine = Engine(replace(engine_for("llama").loaded, model=model), EngineConfig(block_size=4))
    _, steps, _ = run(engine, LONGER_THAN_THE_WINDOW, greedy=True, max_new_tokens=4, ignore_eos=True)
    follow_up = [*LONGER_THAN_THE_WINDOW, *(s.token_id for s in steps), 7, 8]
    events, steps, _ = run(engine, follow_up, greedy=True, max_new_tokens=6, ignore_eos=True)
    assert events[0].num_cached_tokens >= len(LONGER_THAN_THE_WINDOW)
    assert [s.token_id for s in steps] == hf_greedy(model, follow_up, 6, ())
