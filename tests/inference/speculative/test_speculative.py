"""Speculative decoding in the engine (`inference/speculative/`): proposed tokens verified in one
pass give the answer the request gives without them, token for token and number for number
(greedy, and sampled with a seed, under every processor, a grammar, a thinking budget, stops),
alone and in a batch; rejected tokens' KV blocks are given back and never enter the prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference import Finished, SamplingParams, Step
from inference.engine import Engine
from inference.models.loader import LoadedModel
from inference.models.tiny import make_tiny_model, make_tiny_tokenizer
from tests.inference.engines import engine_for
from tests.inference.sampling.test_grammar import JSON_SCHEMA
from tests.inference.test_batching import run_to_ends

PROMPT = list(range(5, 40)) * 3  # a tiny random Llama answers it in a loop: lookups find it


def draft(name: str, seed: int, tokenizer=None) -> LoadedModel:
    model = make_tiny_model("llama", seed=seed)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer or make_tiny_tokenizer(),
        name=name,
        source_path=Path("."),
        dtype=torch.float32,
        device=torch.device("cpu"),
        chat_template=None,
        max_context=model.config.max_position_embeddings,
        eos_token_ids=(),
        precision="float32",
    )


@pytest.fixture(scope="module")
def engine() -> Engine:
    engine = engine_for("llama")
    engine.attach_draft(draft("same-weights", seed=0))  # agrees with the model: its proposals hold
    engine.attach_draft(draft("other-weights", seed=1))
    return engine


def alone(engine: Engine, prompt_ids: list[int], **params) -> tuple[list[Step], Finished]:
    return run_to_ends(engine, [(prompt_ids, SamplingParams(**params))])[0]


def numbers(steps: list[Step]) -> list[tuple]:
    """What a step reports of the model's distribution, bit for bit."""
    return [(s.token_id, s.logprob, s.raw_logprob, s.rank, s.entropy, s.top_raw, s.top_processed) for s in steps]


SPECULATIONS = [
    {"speculative": "prompt_lookup"},
    {"speculative": "prompt_lookup", "num_speculative_tokens": 4},
    {"speculative": "same-weights", "num_speculative_tokens": 3},
    {"speculative": "other-weights", "num_speculative_tokens": 3},
]


@pytest.mark.parametrize("speculation", SPECULATIONS, ids=lambda s: "-".join(map(str, s.values())))
def test_greedy_answers_and_their_numbers_are_the_same_with_speculation(engine: Engine, speculation: dict) -> None:
    params = {"greedy": True, "max_new_tokens": 40, "num_alternatives": 5}
    plain, plain_end = alone(engine, PROMPT, **params)
    steps, end = alone(engine, PROMPT, **params, **speculation)
    assert numbers(steps) == numbers(plain)
    assert end.token_ids == plain_end.token_ids and end.text == plain_end.text
    assert end.finish_reason == plain_end.finish_reason == "length"
    assert end.num_proposed_tokens > 0
    if speculation.get("num_speculative_tokens") and speculation["speculative"] != "other-weights":
        assert end.num_accepted_tokens > 0  # the loop (or the same weights) proposes what the model says
    assert plain_end.num_proposed_tokens == 0 and plain_end.speculative_speedup == 1.0


class _Encodes:
    """A tokenizer that reads the prediction as `token_ids` (the tiny model answers with ids its
    byte-level tokenizer cannot write as text)."""

    def __init__(self, token_ids: tuple[int, ...]) -> None:
        self.token_ids = list(token_ids)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.token_ids


def test_a_prediction_of_the_answer_is_accepted_and_a_wrong_one_changes_nothing(engine: Engine, monkeypatch) -> None:
    params = {"greedy": True, "max_new_tokens": 30}
    plain, plain_end = alone(engine, PROMPT, **params)
    speculator = engine.core.speculator
    add = speculator.add
    monkeypatch.setattr(speculator, "add", lambda request, tokenizer: add(request, _Encodes(plain_end.token_ids)))
    steps, end = alone(engine, PROMPT, **params, prediction="the answer", num_speculative_tokens=16)
    assert end.token_ids == plain_end.token_ids
    # 16 proposed and accepted, the pass's own token after them; then the 11 that remained
    assert end.num_accepted_tokens == end.num_proposed_tokens == 16 + 11
    assert sum(s.verification is not None and s.verification.position == 0 for s in steps) == 2
    assert steps[0].verification is None and steps[0].phase == "prefill"  # the prefill's token is no pass's
    first = steps[1].verification
    assert first is not None and first.source == "prediction" and first.num_accepted == len(first.proposed)
    wrong_ids = plain_end.token_ids[:3] + tuple((t + 1) % 256 for t in plain_end.token_ids[3:])
    monkeypatch.setattr(speculator, "add", lambda request, tokenizer: add(request, _Encodes(wrong_ids)))
    _, wrong = alone(engine, PROMPT, **params, prediction="a wrong answer", num_speculative_tokens=4)
    assert wrong.token_ids == plain_end.token_ids
    assert wrong.num_proposed_tokens > wrong.num_accepted_tokens >= 2  # right as far as it went
    monkeypatch.undo()
    _, as_text = alone(engine, PROMPT, **params, prediction=engine.loaded.tokenizer.decode(plain_end.token_ids))
    assert as_text.token_ids == plain_end.token_ids


def test_each_step_says_what_its_pass_proposed_and_where_the_first_rejection_fell(engine: Engine) -> None:
    steps, end = alone(
        engine, PROMPT, greedy=True, max_new_tokens=40, speculative="other-weights", num_speculative_tokens=3
    )
    verified = [s for s in steps if s.verification is not None]
    assert verified
    for step in verified:
        v = step.verification
        accepted = [p for p in v.proposed if p.is_accepted]
        assert accepted == list(v.proposed[: v.num_accepted])
        assert all(p.prob is not None for p in v.proposed[: v.num_accepted + 1])  # reached: the model's prob
        assert all(p.prob is None for p in v.proposed[v.num_accepted + 1 :])  # past the first rejection
        assert all(0 < p.draft_prob <= 1 for p in v.proposed)
        if v.position < v.num_accepted:
            assert step.token_id == v.proposed[v.position].token_id
        elif v.position < len(v.proposed):
            assert step.token_id != v.proposed[v.position].token_id  # the model's own, not the proposal
    assert end.num_accepted_tokens == sum(s.verification.num_accepted for s in verified if s.verification.position == 0)


@pytest.mark.parametrize("seed", [3, 4])
def test_seeded_sampling_is_the_same_under_every_processor(engine: Engine, seed: int) -> None:
    params = {
        "temperature": 0.7,
        "top_k": 30,
        "top_p": 0.95,
        "min_p": 0.01,
        "repetition_penalty": 1.05,
        "seed": seed,
        "max_new_tokens": 40,
        "num_alternatives": 5,
    }
    plain, plain_end = alone(engine, PROMPT, **params)
    for speculation in SPECULATIONS[1:3]:
        steps, end = alone(engine, PROMPT, **params, **speculation)
        assert numbers(steps) == numbers(plain), speculation
        assert end.seed == plain_end.seed and end.num_proposed_tokens > 0


def test_length_and_stop_strings_end_the_answer_where_they_would_have(engine: Engine) -> None:
    plain, plain_end = alone(engine, PROMPT, greedy=True, max_new_tokens=30)
    stop = plain_end.text[12:15]
    assert stop
    for params in ({"max_new_tokens": 5}, {"max_new_tokens": 30, "stop": [stop]}):
        _, expected = alone(engine, PROMPT, greedy=True, **params)
        _, end = alone(engine, PROMPT, greedy=True, speculative="same-weights", num_speculative_tokens=8, **params)
        assert (end.token_ids, end.text, end.finish_reason) == (
            expected.token_ids,
            expected.text,
            expected.finish_reason,
        )


def test_a_grammar_masks_every_verified_position(engine: Engine) -> None:
    params = {"seed": 1, "max_new_tokens": 120, "grammar": JSON_SCHEMA}
    plain, plain_end = alone(engine, PROMPT, **params)
    steps, end = alone(engine, PROMPT, **params, speculative="same-weights", num_speculative_tokens=4)
    assert [(s.token_id, s.masked_prob) for s in steps] == [(s.token_id, s.masked_prob) for s in plain]
    assert end.text == plain_end.text and end.finish_reason == plain_end.finish_reason
    assert end.num_proposed_tokens > 0


def test_a_thinking_budget_forces_its_tag_at_the_same_positions(engine: Engine) -> None:
    prompt = engine.prompts.encode("Question: 2+2?\n<think>\n")
    params = {"greedy": True, "max_new_tokens": 16, "ignore_eos": True, "max_thinking_tokens": 3}
    plain, _ = alone(engine, prompt, **params)
    steps, end = alone(engine, prompt, **params, speculative="same-weights", num_speculative_tokens=4)
    assert [(s.token_id, s.is_reasoning, s.is_forced) for s in steps] == [
        (s.token_id, s.is_reasoning, s.is_forced) for s in plain
    ]
    assert end.thinking_ended_by_budget and end.num_proposed_tokens > 0


def test_in_a_batch_with_preemption_every_request_gets_its_answer_alone_and_no_block_is_lost() -> None:
    engine = engine_for("llama", kv_cache_bytes=48 * 1024, block_size=8, max_num_batched_tokens=64)
    engine.attach_draft(draft("same-weights", seed=0))
    kinds = [{}, {"speculative": "prompt_lookup"}, {"speculative": "same-weights", "num_speculative_tokens": 5}]
    requests = []
    for i in range(6):
        params = {"max_new_tokens": 24 + 3 * i, **kinds[i % 3]}
        params.update({"greedy": True} if i % 2 else {"temperature": 0.8, "seed": i})
        requests.append((PROMPT[i : 40 + i], SamplingParams(**params)))
    together = run_to_ends(engine, requests, arrive_every=2)
    assert engine.core.scheduler.num_preemptions > 0  # the pool was too small for them all
    for (prompt_ids, params), (steps, end) in zip(requests, together):
        solo_steps, solo_end = alone(
            engine, prompt_ids, **{**params.to_dict(), "speculative": "off", "num_speculative_tokens": None}
        )
        assert numbers(steps) == numbers(solo_steps) and end.finish_reason == solo_end.finish_reason
    bm = engine.core.block_manager
    assert bm.num_free_blocks == bm.num_blocks
    draft_bm = engine.core.speculator.drafts["same-weights"].__self__.block_manager
    assert draft_bm.num_free_blocks == draft_bm.num_blocks  # every request's scratch sequence given back


def test_the_prefix_cache_holds_only_tokens_that_stayed() -> None:
    engine = engine_for("llama", block_size=4)
    engine.attach_draft(draft("other-weights", seed=1))
    steps, end = alone(
        engine, PROMPT, greedy=True, max_new_tokens=40, speculative="other-weights", num_speculative_tokens=5
    )
    assert end.num_proposed_tokens > end.num_accepted_tokens  # some were rejected, their blocks written
    tokens = PROMPT + list(end.token_ids)
    bm = engine.core.block_manager
    hashed = [b for b in bm.blocks if b.hash is not None]
    assert len(hashed) >= len(PROMPT) // 4
    for block in hashed:  # each cached block's tokens are the answer's at some block-aligned place
        assert any(tuple(tokens[i : i + 4]) == block.token_ids for i in range(0, len(tokens), 4))
    # and a request continuing the answer reuses them
    follow_up = tokens[: (len(tokens) // 4) * 4] + [7]
    _, again = alone(engine, follow_up, greedy=True, max_new_tokens=2)
    assert again.num_cached_tokens >= len(follow_up) - 4 - 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"speculative": "nope"}, "speculative='nope' is not a draft model"),
        ({"speculative": ""}, "speculative=''"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens=0"),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens=17"),
        ({"speculative": "prompt_lookup", "num_beams": 2}, "do not apply to beam search"),
        ({"prediction": "x", "use_kv_cache": False}, "need the KV cache"),
        ({"prediction": 5}, "prediction=5"),
    ],
)
def test_bad_settings_are_a_value_error_naming_the_field(engine: Engine, fields: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        engine.add_request(PROMPT, SamplingParams(**fields))


def test_a_draft_with_another_tokenizer_is_refused(engine: Engine) -> None:
    other = make_tiny_tokenizer(special_tokens=("<|a|>", "<|b|>", "<|c|>"))
    with pytest.raises(ValueError, match="tokenizer is not"):
        engine.attach_draft(draft("other-tokenizer", seed=0, tokenizer=other))
    assert "other-tokenizer" not in engine.core.speculator.drafts


@pytest.mark.parametrize("arch", ["gpt2", "deepseek_v3"])
def test_other_architectures_verify_through_the_transformers_runner(arch: str) -> None:
    """Their runner is not batch-invariant: a verified row may round differently from a decode
    row, so the numbers agree closely and the greedy tokens (no near-ties here) exactly."""
    engine = engine_for(arch)
    plain, plain_end = alone(engine, PROMPT, greedy=True, max_new_tokens=30)
    steps, end = alone(
        engine, PROMPT, greedy=True, max_new_tokens=30, speculative="prompt_lookup", num_speculative_tokens=4
    )
    assert end.token_ids == plain_end.token_ids and end.num_accepted_tokens > 0
    assert max(abs(a.raw_logprob - b.raw_logprob) for a, b in zip(plain, steps)) < 1e-4


def test_a_prefill_worker_hands_over_and_the_decode_worker_speculates(engine: Engine) -> None:
    """The prefill worker has no draft (it never decodes the request); the decode worker's does."""
    params = SamplingParams(greedy=True, max_new_tokens=30, speculative="same-weights", num_speculative_tokens=4)
    prefill_side = engine_for("llama")
    handoff = engine.import_handoff(prefill_side.export_handoff(prefill_side.prefill_for_handoff(PROMPT, params)))
    assert prefill_side.core.speculator.states == {}
    resumed = list(engine.generate(PROMPT, params, handoff=handoff))
    _, plain = alone(engine, PROMPT, greedy=True, max_new_tokens=30)
    assert resumed[-1].token_ids == plain.token_ids and resumed[-1].num_accepted_tokens > 0
