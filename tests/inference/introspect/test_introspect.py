"""The introspection math (inference/introspect/) against the engine's own values on the
bundled model: the waterfall's stages against the processors and the sampled distribution,
the what-if against real reruns with the same seed, the lens's last layer against the
model's output, the KV formula against the measured cache."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from inference import EngineConfig, SamplingParams
from inference.engine import Engine
from inference.introspect import kv, lens
from inference.introspect.recompute import recompute
from inference.introspect.waterfall import waterfall
from inference.introspect.whatif import what_if
from inference.sampling.logits import apply_processors, build_processors
from tests.inference.engines import engine_for, run

PROMPT = "The capital of France is"
ALL_STAGES = SamplingParams(
    temperature=1.3, top_k=30, top_p=0.8, min_p=0.02, repetition_penalty=1.3, max_new_tokens=12, seed=11
)


@pytest.fixture(scope="module")
def engine(bundled) -> Engine:
    return Engine(bundled, EngineConfig())


def generated(engine: Engine, params: SamplingParams) -> tuple[list[int], list]:
    prompt = engine.prompts.encode(PROMPT)
    _, steps, _ = run(engine, prompt, **{**params.to_dict(), "num_alternatives": 20})
    return prompt, steps


def test_recomputed_logits_are_the_steps_own(engine: Engine) -> None:
    prompt, steps = generated(engine, ALL_STAGES)
    again = recompute(engine.model, prompt, [s.token_id for s in steps])
    assert again.num_steps == len(steps)
    for k, step in enumerate(steps):
        raw = torch.log_softmax(again.logits(k), dim=-1)
        assert float(raw[step.token_id]) == pytest.approx(step.raw_logprob, abs=1e-4)


def test_waterfall_stages_are_the_processors(engine: Engine) -> None:
    prompt, steps = generated(engine, ALL_STAGES)
    again = recompute(engine.model, prompt, [s.token_id for s in steps])
    k = 3
    logits, context = again.logits(k), again.context(k)
    fall = waterfall(logits, context, ALL_STAGES, sampled_token_id=steps[k].token_id, top_n=20)
    names = [s["name"] for s in fall["stages"]]
    assert names == ["raw", "repetition_penalty", "temperature", "top_k", "top_p", "min_p"]
    processors = build_processors(ALL_STAGES)
    for i, stage in enumerate(fall["stages"]):
        expected = apply_processors(processors[:i], logits[None], context[None])[0]
        assert stage["num_kept"] == int(torch.isfinite(expected).sum())
        probs = torch.softmax(expected, dim=-1)
        for top in stage["top"]:
            assert top["prob"] == pytest.approx(float(probs[top["token_id"]]), rel=1e-5)
    assert fall["stages"][3]["num_kept"] <= 30 and fall["stages"][3]["num_removed"] > 0
    top_p = fall["stages"][4]
    assert 1 - top_p["removed_mass"] >= 0.8 - 1e-6  # the nucleus keeps at least p of the mass
    # The last stage is the distribution the engine sampled from: its reported top and the chosen token's p.
    last = fall["stages"][-1]
    assert last["sampled"]["is_kept"]
    assert last["sampled"]["prob"] == pytest.approx(math.exp(steps[k].logprob), rel=1e-3)
    engine_top = {a.token_id: a.prob for a in steps[k].top_processed}
    assert [t["token_id"] for t in last["top"]] == list(engine_top)[: len(last["top"])]
    for t in last["top"]:
        assert t["prob"] == pytest.approx(engine_top[t["token_id"]], rel=1e-3, abs=1e-6)


def test_waterfall_removed_tokens_held_the_reported_mass(engine: Engine) -> None:
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    fall = waterfall(logits, torch.tensor([0]), SamplingParams(top_k=2), sampled_token_id=2)
    raw, top_k = fall["stages"]
    probs = torch.softmax(logits, dim=-1)
    assert top_k["num_kept"] == 2 and top_k["num_removed"] == 3
    assert top_k["removed_mass"] == pytest.approx(float(probs[2:].sum()))
    assert [t["token_id"] for t in top_k["removed_top"]] == [2, 3, 4]
    assert top_k["sampled"] == {"prob": 0.0, "rank": None, "is_kept": False}
    assert raw["sampled"]["rank"] == 3


@pytest.mark.parametrize("params", [ALL_STAGES, replace(ALL_STAGES, penalize_prompt=False)])
def test_same_settings_replay_the_generation(engine: Engine, params: SamplingParams) -> None:
    prompt, steps = generated(engine, params)
    result = what_if(recompute(engine.model, prompt, [s.token_id for s in steps]), params)
    assert result["diverged_at"] is None
    assert [s["token_id"] for s in result["steps"]] == [s.token_id for s in steps]
    assert all(p > 0 for p in result["original_probs"])


@pytest.mark.parametrize(
    "other",
    [
        SamplingParams(temperature=1.8, top_p=0.5, max_new_tokens=12, seed=11),
        SamplingParams(temperature=1.0, max_new_tokens=12, seed=5),
        SamplingParams(temperature=0.0, max_new_tokens=12),
        SamplingParams(temperature=0.9, top_k=3, min_p=0.1, max_new_tokens=12, seed=123),
    ],
)
def test_what_if_is_a_real_rerun_up_to_the_first_difference(engine: Engine, other: SamplingParams) -> None:
    prompt, steps = generated(engine, ALL_STAGES)
    result = what_if(recompute(engine.model, prompt, [s.token_id for s in steps]), other)
    _, rerun, _ = run(engine, prompt, **other.to_dict())
    replayed = [s["token_id"] for s in result["steps"]]
    assert replayed == [s.token_id for s in rerun][: len(replayed)]
    if result["diverged_at"] is not None:
        k = result["diverged_at"]
        assert replayed[:k] == [s.token_id for s in steps][:k] and replayed[k] != steps[k].token_id
    assert len(result["original_probs"]) == len(steps)


def test_what_if_reports_the_seed_it_drew(engine: Engine) -> None:
    prompt, steps = generated(engine, ALL_STAGES)
    params = SamplingParams(temperature=1.0, max_new_tokens=12)  # no seed: one is drawn and reported
    result = what_if(recompute(engine.model, prompt, [s.token_id for s in steps]), params)
    _, rerun, _ = run(engine, prompt, **{**params.to_dict(), "seed": result["seed"]})
    replayed = [s["token_id"] for s in result["steps"]]
    assert replayed == [s.token_id for s in rerun][: len(replayed)]


def test_lens_last_row_is_the_streamed_distribution(engine: Engine) -> None:
    prompt, steps = generated(engine, ALL_STAGES)
    ids = prompt + [s.token_id for s in steps]
    position = len(prompt) + 1  # predicts generated token 2
    layer_logits = engine.passes.read_layers(ids[: position + 1])  # (L + 1, vocab)
    assert layer_logits.shape[0] == engine.model.config.num_hidden_layers + 1
    streamed = engine.passes.teacher_force(prompt, ids[len(prompt) : position + 1])[-1]  # the stream's step 2
    assert torch.equal(layer_logits[-1], streamed)  # bitwise: the served runner and kernels
    rows = lens.lens_rows(layer_logits, top_n=5)
    raw = {a.token_id: a.prob for a in steps[2].top_raw}
    assert [t["token_id"] for t in rows[-1]["top"]] == list(raw)[:5]
    for top in rows[-1]["top"]:
        assert top["prob"] == pytest.approx(raw[top["token_id"]], rel=1e-5)


def test_lens_middle_layers_go_through_the_final_norm(engine: Engine) -> None:
    ids = engine.prompts.encode(PROMPT)
    rows = lens.lens_rows(engine.passes.read_layers(ids), top_n=3)
    with torch.inference_mode():
        hidden = engine.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[10][0, -1]
        logits = engine.model.lm_head(engine.model.model.norm(hidden[None]))[0]
    expected = torch.softmax(logits, dim=-1).topk(3)
    assert [t["token_id"] for t in rows[10]["top"]] == expected.indices.tolist()
    assert rows[10]["top"][0]["prob"] == pytest.approx(float(expected.values[0]), rel=1e-3)


def test_attention_weights_of_a_layer(engine: Engine) -> None:
    ids = engine.prompts.encode(PROMPT)
    weights = torch.tensor(lens.attention_of(engine.model, ids, layer=4))
    assert weights.shape == (engine.model.config.num_attention_heads, len(ids))
    assert torch.allclose(weights.sum(dim=-1), torch.ones(weights.shape[0]), atol=1e-4)
    assert engine.model.config._attn_implementation == "sdpa"  # restored for the served model


def test_scored_prompt_equals_the_stream(engine: Engine) -> None:
    """A text scored in one pass (in chunks of 5 positions, every row's logits) gives each
    position the logits the stream computed there, bitwise."""
    prompt, steps = generated(engine, ALL_STAGES)
    answer = [s.token_id for s in steps]
    streamed = engine.passes.teacher_force(prompt, answer[:-1])  # (n, vocab)
    scored: dict[int, torch.Tensor] = {}
    engine.passes.score(prompt + answer[:-1], lambda first, logits: scored.update(enumerate(logits, first)), max_rows=5)
    assert sorted(scored) == list(range(len(prompt) + len(answer) - 1))
    for k in range(len(answer)):
        assert torch.equal(scored[len(prompt) - 1 + k], streamed[k]), k


def test_passes_in_small_chunks_give_the_same_logits_and_pace_after_each(engine: Engine) -> None:
    """An inspection runs in chunks of the token budget and calls `pace` after each (the worker's
    loop steps the batch there): chunked, the logits are bitwise those of one pass."""
    prompt, steps = generated(engine, ALL_STAGES)
    answer = [s.token_id for s in steps][:4]
    passes = engine.passes
    whole = (passes.teacher_force(prompt, answer), passes.read_layers(prompt + answer))
    num_paced = 0

    def pace() -> None:
        nonlocal num_paced
        num_paced += 1

    old = passes.chunk_tokens, passes.pace
    passes.chunk_tokens, passes.pace = 3, pace
    try:
        chunked = (passes.teacher_force(prompt, answer), passes.read_layers(prompt + answer))
    finally:
        passes.chunk_tokens, passes.pace = old
    assert torch.equal(chunked[0], whole[0]) and torch.equal(chunked[1], whole[1])
    num_prefill_chunks = -(-len(prompt) // 3)
    assert num_paced == num_prefill_chunks + len(answer) + -(-(len(prompt) + len(answer) - 1) // 3)


def test_embedding_neighbours_by_cosine(engine: Engine) -> None:
    token_id = engine.prompts.encode(" Paris")[0]
    emb = lens.embedding_of(engine.model, token_id, top_n=5)
    table = engine.model.get_input_embeddings().weight.detach().float()
    assert emb["size"] == table.shape[1]
    assert emb["norm"] == pytest.approx(float(table[token_id].norm()), rel=1e-5)
    cosines = [n["cosine"] for n in emb["nearest"]]
    assert cosines == sorted(cosines, reverse=True) and token_id not in [n["token_id"] for n in emb["nearest"]]
    best = emb["nearest"][0]
    direct = torch.nn.functional.cosine_similarity(table[token_id], table[best["token_id"]], dim=0)
    assert best["cosine"] == pytest.approx(float(direct), abs=1e-5)


def test_bad_layers_are_refused(engine: Engine) -> None:
    with pytest.raises(ValueError, match="layer 99"):
        lens.attention_of(engine.model, [1, 2, 3], layer=99)


def test_kv_formula_is_the_measured_cache(engine: Engine) -> None:
    shape = kv.kv_shape(engine.model)
    assert shape["bytes_per_token"] == engine.info.kv_bytes_per_token
    assert shape["kind"] == "gqa" and shape["num_kv_heads"] < shape["num_heads"]
    request = kv.request_kv(shape, num_tokens=100, num_cached_tokens=40)
    assert request["total_bytes"] == 100 * engine.info.kv_bytes_per_token
    assert request["cached_bytes"] == 40 * engine.info.kv_bytes_per_token


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "llama", "deepseek_v3"])
def test_kv_formula_on_other_architectures(arch: str) -> None:
    tiny = engine_for(arch)
    assert kv.kv_shape(tiny.model)["bytes_per_token"] == tiny.info.kv_bytes_per_token


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_lens_and_recompute_on_other_architectures(arch: str) -> None:
    tiny = engine_for(arch)
    prompt = [5, 6, 7, 8]
    _, steps, _ = run(tiny, prompt, max_new_tokens=4, temperature=0.0, num_alternatives=3)
    again = recompute(tiny.model, prompt, [s.token_id for s in steps])
    assert int(again.logits(2).argmax()) == steps[2].token_id
    layer_logits = tiny.passes.read_layers(prompt + [s.token_id for s in steps][:2])
    assert layer_logits.shape[0] == tiny.model.config.num_hidden_layers + 1
    assert int(layer_logits[-1].argmax()) == steps[2].token_id
    assert len(lens.attention_of(tiny.model, prompt, layer=0)) == tiny.model.config.num_attention_heads
    scored: dict[int, torch.Tensor] = {}
    tiny.passes.score(
        prompt + [s.token_id for s in steps], lambda first, logits: scored.update(enumerate(logits, first))
    )
    assert [int(scored[len(prompt) - 1 + k].argmax()) for k in range(len(steps))] == [s.token_id for s in steps]
