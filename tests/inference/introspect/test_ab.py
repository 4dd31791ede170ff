"""The A/B comparison (inference/introspect/ab.py) on the bundled model: its KL against a direct
computation from the two distributions (and against the steps the engine streamed), its
flips against the two real generations, identical settings giving no flip and KL 0."""

from __future__ import annotations

import math

import pytest
import torch

from inference import EngineConfig, SamplingParams
from inference.engine import Engine
from inference.introspect.ab import Side, compare, kl_divergence
from inference.introspect.recompute import recompute
from tests.inference.engines import run

PROMPT = "The capital of France is"
GREEDY = SamplingParams(greedy=True, max_new_tokens=10)
CREATIVE = SamplingParams(temperature=1.1, top_p=0.95, min_p=0.05, max_new_tokens=10, seed=3)


@pytest.fixture(scope="module")
def engine(bundled) -> Engine:
    return Engine(bundled, EngineConfig())


def side(engine: Engine, params: SamplingParams) -> tuple[Side, list]:
    """A real generation under `params` and its side (its path recomputed)."""
    prompt = engine.prompts.encode(PROMPT)
    _, steps, _ = run(engine, prompt, **{**params.to_dict(), "num_alternatives": 20})
    return Side(recompute(engine.model, prompt, [s.token_id for s in steps]), params), steps


def test_kl_is_the_direct_sum_between_two_temperatures(engine: Engine) -> None:
    a, _ = side(engine, SamplingParams(temperature=0.6, max_new_tokens=10, seed=1))
    b, _ = side(engine, SamplingParams(temperature=1.4, max_new_tokens=10, seed=2))
    result = compare(a, b)
    assert result["num_steps"] == min(len(a.path), len(b.path))
    for step in result["steps"]:
        k = step["index"]
        logits_a = a.recomputed.logits(k)
        logits_b = logits_a if step["same_context"] else b.recomputed.logits(k)
        # Direct: torch's own KL over the two tempered softmaxes, no processor code, in float64
        # as the view computes it (in float32 the sum over 49k tokens was 1e-5 off).
        direct = torch.nn.functional.kl_div(
            torch.log_softmax(logits_b.double() / 1.4, -1),
            torch.log_softmax(logits_a.double() / 0.6, -1),
            reduction="sum",
            log_target=True,
        )
        assert step["kl"] == pytest.approx(float(direct), rel=1e-5, abs=1e-7)
        assert step["kl"] > 0


def test_greedy_against_a_sampler_is_minus_the_log_probability_of_greedys_token(engine: Engine) -> None:
    a, greedy_steps = side(engine, GREEDY)
    b, creative_steps = side(engine, CREATIVE)
    result = compare(a, b)
    # Greedy draws its token with probability 1, so KL(A||B) = -log p_B(that token). At step 0
    # both read the prompt: p_B is what the engine streamed for B's step 0.
    streamed = {t.token_id: t.logprob for t in creative_steps[0].top_processed}
    assert result["steps"][0]["kl"] == pytest.approx(-streamed[greedy_steps[0].token_id], rel=1e-4)
    flips = [x != y for x, y in zip(a.path, b.path)]
    assert [s["flipped"] for s in result["steps"]] == flips[: result["num_steps"]]
    first = flips.index(True)  # seed 3 flips at step 5: the steps after it read different texts
    assert result["first_flip"] == first
    assert [s["same_context"] for s in result["steps"]] == [k <= first for k in range(len(flips))]


def test_identical_settings_and_seed_have_no_flip_and_kl_zero(engine: Engine) -> None:
    a, _ = side(engine, CREATIVE)
    b, _ = side(engine, CREATIVE)
    result = compare(a, b)
    assert a.path == b.path and result["first_flip"] is None
    assert [s["kl"] for s in result["steps"]] == [0.0] * len(a.path)
    assert not any(s["flipped"] for s in result["steps"])


def test_a_token_b_filtered_out_makes_kl_infinite() -> None:
    full = torch.log_softmax(torch.tensor([2.0, 1.0, 0.0]), -1)
    top_1 = torch.tensor([0.0, -math.inf, -math.inf])
    assert kl_divergence(full, top_1) == math.inf
    assert kl_divergence(top_1, full) == pytest.approx(-float(full[0]))


def test_different_prompts_are_refused(engine: Engine) -> None:
    a, _ = side(engine, GREEDY)
    other = Side(recompute(engine.model, engine.prompts.encode("Hello"), a.path), GREEDY)
    with pytest.raises(ValueError, match="same prompt"):
        compare(a, other)
