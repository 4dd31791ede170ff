"""Fuzz over every numeric field of `SamplingParams`: a value is either refused with a
`ValueError` naming its field, or the real processors and sampler turn realistic logits into a
distribution with no NaN, at least one token left, and a drawn token inside the vocabulary
(issue 21: temperature 1e-40 or repetition_penalty 1e-300 used to make a NaN row, whose draw
indexed past the vocabulary and ended the worker's whole batch).

Logits: the bundled model's own for a few prompts (a real model's spread, its bfloat16 ties
when cast), plus harsh shapes (one spike far above the rest, everything equal, large
magnitudes, tokens the model masks with -inf), in float32 and bfloat16, a batch of 4 rows.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from inference.models.loader import LoadedModel
from inference.sampling.logits import apply_processors, build_processors
from inference.sampling.sampler import Sampler
from inference.sampling_params import MIN_TEMPERATURE, SamplingParams

PROMPTS = ["The capital of France is", "1, 2, 3,", "<|im_start|>user\n你好<|im_end|>\n<|im_start|>assistant\n"]
NUM_CONTEXT_IDS = 24
NUM_ROWS = len(PROMPTS) + 4  # the harsh rows of `realistic_logits`
_NOT_NUMBERS = [math.nan, math.inf, -math.inf, "1", None, True]


def field(valid: st.SearchStrategy, edges: list[Any], invalid: list[Any]) -> st.SearchStrategy:
    """Mostly valid values (so most examples reach the sampler), the edges of the valid range
    (where it broke before), and values just past them or not numbers at all."""
    return st.one_of(valid, valid, valid, st.sampled_from(edges), st.sampled_from(invalid + _NOT_NUMBERS) | st.floats())


temperatures = field(st.floats(0, 100), [0.0, 1e-300, 1e-40, 1e-10, 9.99e-6, 1e-5, 1e-3, 100.0], [-1e-300, 100.01])
penalties = field(st.floats(0.01, 100), [0.01, 1.0, 100.0], [1e-300, 1e-40, 0.0099, 0.0, -1.0, 100.5])
top_ps = field(st.floats(1e-300, 1.0), [1e-300, 1e-10, 1.0], [0.0, -0.1, 1.0000001])
min_ps = field(st.floats(0.0, 1.0, exclude_max=True), [0.0, 1e-300, 0.999999], [1.0, -0.1])
top_ks = field(st.integers(0, 70_000), [0, 1, 49_151, 49_152, 10_000_000], [-1, 2.5, 10_000_001])


@pytest.fixture(scope="module")
def realistic_logits(bundled: LoadedModel) -> torch.Tensor:
    """(8, V) float32: the bundled model's next-token logits for PROMPTS, then harsh rows."""
    rows = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = bundled.tokenizer(prompt, return_tensors="pt").input_ids
            rows.append(bundled.model(ids).logits[0, -1].float())
    vocab_size = rows[0].shape[-1]
    generator = torch.Generator().manual_seed(0)
    spread = torch.randn(vocab_size, generator=generator) * 3
    spike = spread.clone()
    spike[7] = 60.0  # one token far above the rest: a near one-hot distribution
    masked = rows[0].clone()
    masked[vocab_size // 2 :] = -math.inf  # a model that masks part of its vocabulary
    rows += [spike, torch.zeros(vocab_size), spread * 1000, masked]  # all tied; huge magnitudes
    assert len(rows) == NUM_ROWS
    return torch.stack(rows)


def _check_distribution(processed: torch.Tensor) -> None:
    assert not processed.isnan().any(), "a processor produced NaN"
    assert torch.isfinite(processed).any(dim=-1).all(), "a processor filtered every token of a row"
    assert not (processed == math.inf).any(), "a processor produced +inf (its softmax is NaN)"


@hypothesis_settings(
    max_examples=350, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    temperature=temperatures,
    repetition_penalty=penalties,
    top_p=top_ps,
    min_p=min_ps,
    top_k=top_ks,
    greedy=st.booleans(),
    seed=st.one_of(st.none(), st.integers(-1, 2**64)),
    rows=st.lists(st.integers(0, NUM_ROWS - 1), min_size=4, max_size=4),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
)
def test_any_sampling_values_are_refused_by_name_or_give_a_valid_distribution(
    realistic_logits: torch.Tensor, rows: list[int], dtype: torch.dtype, **values: Any
) -> None:
    try:
        params = SamplingParams(**values)
    except ValueError as exc:
        assert str(exc).split("=")[0].split()[0] in values, f"the refusal does not name its field: {exc}"
        return
    logits = realistic_logits[rows].to(dtype)  # (4, V), as a batch step hands the sampler
    vocab_size = logits.shape[-1]
    context_ids = torch.stack([logits[i].float().topk(NUM_CONTEXT_IDS).indices for i in range(4)])  # penalise the top
    _check_distribution(apply_processors(build_processors(params), logits.float(), context_ids))
    _check_distribution(apply_processors(build_processors(params), logits, context_ids))  # in the model's dtype

    out = Sampler(params, "cpu")(logits, context_ids)
    assert not out.logprobs.isnan().any() and not out.raw_logprobs.isnan().any()
    assert ((out.token_ids >= 0) & (out.token_ids < vocab_size)).all()
    chosen = out.logprobs.gather(-1, out.token_ids[:, None])
    assert torch.isfinite(chosen).all(), "the drawn token had no probability"


@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 1e-10, MIN_TEMPERATURE / 2])
def test_a_temperature_below_the_floor_is_greedy(temperature: float) -> None:
    params = SamplingParams(temperature=temperature)
    assert params.temperature == 0.0 and params.is_greedy
    assert SamplingParams(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE


@pytest.mark.parametrize("penalty", [1e-300, 0.0099, 100.5, -1.0])
def test_a_repetition_penalty_out_of_bounds_is_refused_naming_it(penalty: float) -> None:
    with pytest.raises(ValueError, match=r"^repetition_penalty=.* must be in \[0\.01, 100\.0\]"):
        SamplingParams(repetition_penalty=penalty)


def test_a_nan_row_is_a_clear_error_not_an_index_past_the_vocabulary() -> None:
    """What the model itself could hand over (e.g. an overflowed float16 pass)."""
    logits = torch.full((2, 10), math.nan)
    for params in (SamplingParams(greedy=True), SamplingParams(seed=1)):
        with pytest.raises(ValueError, match="sampling distribution is empty or not a number"):
            Sampler(params, "cpu")(logits, torch.zeros(2, 0, dtype=torch.long))
