"""inference.sampling.logits: each processor equals its transformers counterpart, is pure, keeps exactly
the tokens it should, and runs in the documented order."""

from __future__ import annotations

import math
import re

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from inference import SamplingParams
from inference.sampling.logits import (
    MinP,
    RepetitionPenalty,
    Temperature,
    TopK,
    TopP,
    apply_processors,
    build_processors,
)

VOCAB_SIZE = 300

# (ours, transformers') for the same setting
PAIRS = [
    (RepetitionPenalty(1.3), RepetitionPenaltyLogitsProcessor(1.3)),
    (RepetitionPenalty(0.7), RepetitionPenaltyLogitsProcessor(0.7)),
    (Temperature(0.5), TemperatureLogitsWarper(0.5)),
    (Temperature(1.7), TemperatureLogitsWarper(1.7)),
    (TopK(1), TopKLogitsWarper(1)),
    (TopK(17), TopKLogitsWarper(17)),
    (TopK(VOCAB_SIZE + 5), TopKLogitsWarper(VOCAB_SIZE + 5)),
    (TopP(0.05), TopPLogitsWarper(0.05)),
    (TopP(0.5), TopPLogitsWarper(0.5)),
    (TopP(0.95), TopPLogitsWarper(0.95)),
    (TopP(1.0), TopPLogitsWarper(1.0)),
    (MinP(0.0), MinPLogitsWarper(0.0)),
    (MinP(0.05), MinPLogitsWarper(0.05)),
    (MinP(0.4), MinPLogitsWarper(0.4)),
    (MinP(1.0), MinPLogitsWarper(1.0)),
]


def random_batch(seed: int, scale: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, VOCAB_SIZE, generator=g) * scale
    context_ids = torch.randint(0, VOCAB_SIZE, (4, 25), generator=g)
    return logits, context_ids


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.nonzero(logits[0] > -math.inf).flatten().tolist())


def from_probs(probs: list[float]) -> torch.Tensor:
    return torch.tensor([probs]).log()


@pytest.mark.parametrize("ours,theirs", PAIRS, ids=[repr(ours) for ours, _ in PAIRS])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_processor_equals_transformers(ours, theirs, seed):
    logits, context_ids = random_batch(seed)
    expected = theirs(context_ids, logits.clone())
    actual = ours(logits, context_ids)
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected))
    assert torch.allclose(actual, expected)


@pytest.mark.parametrize("p", [0.3, 0.9, 1.0])
def test_top_p_after_filtering_equals_transformers(p):
    """Rows already cut to different sizes (top-k 20 and 5) take TopP's shortcut path."""
    logits, context_ids = random_batch(5)
    logits = torch.cat([TopK(20)(logits[:2], context_ids[:2]), TopK(5)(logits[2:], context_ids[2:])])
    expected = TopPLogitsWarper(p)(context_ids, logits.clone())
    actual = TopP(p)(logits, context_ids)
    assert torch.equal(torch.isneginf(actual), torch.isneginf(expected))
    assert torch.allclose(actual, expected)


@pytest.mark.parametrize("ours", [p for p, _ in PAIRS], ids=repr)
def test_processor_is_pure(ours):
    logits, context_ids = random_batch(7)
    logits_before, context_before = logits.clone(), context_ids.clone()
    out = ours(logits, context_ids)
    assert torch.equal(logits, logits_before)
    assert torch.equal(context_ids, context_before)
    assert out.data_ptr() != logits.data_ptr()


def test_repetition_penalty_divides_positive_multiplies_negative_once_per_token():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    out = RepetitionPenalty(2.0)(logits, torch.tensor([[0, 1, 1, 1]]))
    assert out.tolist() == [[1.0, -4.0, 1.0, 0.5]]


def test_repetition_penalty_ignores_ids_past_the_logits():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = RepetitionPenalty(2.0)(logits, torch.tensor([[2, 7]]))
    assert out.tolist() == [[2.0, -2.0, 0.5]]


@pytest.mark.parametrize(
    "logits,k,expected",
    [
        ([1.0, 3.0, 3.5, 2.0], 2, {1, 2}),
        ([1.0, 3.0, 3.0, 2.0], 1, {1, 2}),  # a tie with the k-th token is kept
        ([3.0, 3.0, 3.0, 1.0], 2, {0, 1, 2}),
        ([1.0, 2.0], 5, {0, 1}),  # k larger than the vocabulary
    ],
)
def test_top_k_kept_set(logits, k, expected):
    assert kept(TopK(k)(torch.tensor([logits]), torch.empty(1, 0, dtype=torch.long))) == expected


@pytest.mark.parametrize(
    "probs,p,expected",
    [
        ([0.5, 0.25, 0.15, 0.1], 0.3, {0}),
        ([0.5, 0.25, 0.15, 0.1], 0.6, {0, 1}),
        ([0.5, 0.25, 0.15, 0.1], 0.8, {0, 1, 2}),
        ([0.5, 0.25, 0.15, 0.1], 1.0, {0, 1, 2, 3}),
        ([0.1, 0.15, 0.25, 0.5], 0.6, {2, 3}),  # order in the vocabulary does not matter
        ([0.97, 0.01, 0.01, 0.01], 1e-6, {0}),  # always at least the most likely token
        ([0.97, 0.01, 0.01, 0.01], 0.9, {0}),  # the top token alone can exceed p
    ],
)
def test_top_p_kept_set(probs, p, expected):
    assert kept(TopP(p)(from_probs(probs), torch.empty(1, 0, dtype=torch.long))) == expected


def test_top_p_tie_at_the_boundary_keeps_one_token_like_transformers():
    logits = from_probs([0.4, 0.4, 0.2])
    ours = TopP(0.3)(logits, torch.empty(1, 0, dtype=torch.long))
    theirs = TopPLogitsWarper(0.3)(torch.empty(1, 0, dtype=torch.long), logits.clone())
    assert len(kept(ours)) == 1
    assert kept(ours) == kept(theirs)


@pytest.mark.parametrize(
    "probs,p,expected",
    [
        ([0.5, 0.3, 0.15, 0.05], 0.25, {0, 1, 2}),  # threshold 0.125
        ([0.5, 0.3, 0.15, 0.05], 0.7, {0}),  # threshold 0.35
        ([0.5, 0.3, 0.15, 0.05], 0.05, {0, 1, 2, 3}),
        ([0.4, 0.4, 0.2], 1.0, {0, 1}),  # tied top tokens both survive p = 1
    ],
)
def test_min_p_kept_set(probs, p, expected):
    assert kept(MinP(p)(from_probs(probs), torch.empty(1, 0, dtype=torch.long))) == expected


def test_build_processors_fixed_order():
    params = SamplingParams(repetition_penalty=1.2, temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)
    processors = build_processors(params)
    assert [type(p) for p in processors] == [RepetitionPenalty, Temperature, TopK, TopP, MinP]
    logits, context_ids = random_batch(3)
    theirs = LogitsProcessorList(
        [
            RepetitionPenaltyLogitsProcessor(1.2),
            TemperatureLogitsWarper(0.7),
            TopKLogitsWarper(5),
            TopPLogitsWarper(0.9),
            MinPLogitsWarper(0.05),
        ]
    )(context_ids, logits.clone())
    assert torch.allclose(apply_processors(processors, logits, context_ids), theirs)


def test_order_matters_temperature_before_top_p():
    """The nucleus is taken of the tempered distribution: a low temperature shrinks it."""
    logits = from_probs([0.5, 0.3, 0.2])
    no_context = torch.empty(1, 0, dtype=torch.long)
    ours = apply_processors(build_processors(SamplingParams(temperature=0.3, top_p=0.8)), logits, no_context)
    reversed_order = Temperature(0.3)(TopP(0.8)(logits, no_context), no_context)
    assert kept(ours) == {0}
    assert kept(reversed_order) == {0, 1}


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, temperature=1.0),
    ],
)
def test_build_processors_skips_settings_that_are_off(params):
    assert build_processors(params) == []


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(greedy=True, temperature=0.5, top_k=3, top_p=0.5, min_p=0.2, repetition_penalty=1.5),
        SamplingParams(temperature=0.0, top_k=3, top_p=0.5, min_p=0.2, repetition_penalty=1.5),
    ],
)
def test_greedy_keeps_only_the_repetition_penalty(params):
    assert build_processors(params) == [RepetitionPenalty(1.5)]


def test_apply_processors_without_processors_returns_logits_unchanged():
    logits, context_ids = random_batch(4)
    assert torch.equal(apply_processors([], logits, context_ids), logits)


@pytest.mark.parametrize(
    "make,value",
    [
        (RepetitionPenalty, 0.0),
        (RepetitionPenalty, -1.5),
        (RepetitionPenalty, float("nan")),
        (Temperature, 0.0),
        (Temperature, -0.5),
        (Temperature, float("inf")),
        (Temperature, "hot"),
        (TopK, 0),
        (TopK, -3),
        (TopK, 2.5),
        (TopK, True),
        (TopP, 0.0),
        (TopP, 1.5),
        (TopP, -0.1),
        (MinP, -0.1),
        (MinP, 1.5),
        (MinP, float("nan")),
    ],
)
def test_bad_value_is_a_value_error_naming_it(make, value):
    with pytest.raises(ValueError, match=re.escape(repr(value))):
        make(value)
