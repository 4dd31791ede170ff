"""inference.sampling.sampler: draws follow the processed distribution, filtered tokens never come out,
seeds reproduce, greedy is argmax; and the distribution read-outs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from scipy.stats import chisquare

from inference import SamplingParams
from inference.intake import choice_seeds as _choice_seeds
from inference.sampling.logits import apply_processors, build_processors
from inference.sampling.sampler import Sampler, entropy, token_rank, top_alternatives
from inference.sampling_params import MAX_SEED

PROBS_6 = [0.3, 0.25, 0.2, 0.12, 0.08, 0.05]
NUM_DRAWS = 20_000
NO_CONTEXT = torch.empty(1, 0, dtype=torch.long)


def draw_counts(params: SamplingParams, logits: torch.Tensor, num_draws: int = NUM_DRAWS) -> torch.Tensor:
    """Counts per token of `num_draws` draws from one row of logits (one batched call)."""
    sampler = Sampler(params, "cpu")
    out = sampler(logits.expand(num_draws, -1), NO_CONTEXT.expand(num_draws, -1))
    return torch.bincount(out.token_ids, minlength=logits.shape[-1])


def processed_probs(params: SamplingParams, logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(apply_processors(build_processors(params), logits, NO_CONTEXT), dim=-1)[0]


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    support = probs > 0
    expected = probs[support].double() / probs[support].double().sum() * counts.sum()
    return chisquare(counts[support].double().numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(seed=1),
        SamplingParams(seed=2, temperature=0.7),
        SamplingParams(seed=3, temperature=1.5, top_k=4),
        SamplingParams(seed=4, top_p=0.8),
        SamplingParams(seed=5, temperature=0.8, top_k=5, top_p=0.9, min_p=0.1),
    ],
)
def test_draws_match_the_processed_distribution(params):
    logits = torch.tensor([PROBS_6]).log()
    counts = draw_counts(params, logits)
    probs = processed_probs(params, logits)
    assert chi_square_p_value(counts, probs) > 1e-3
    assert counts[probs == 0].sum() == 0


def test_chi_square_rejects_a_wrong_distribution():
    """The goodness-of-fit check above can fail: draws at temperature 0.7 do not fit T = 1."""
    logits = torch.tensor([PROBS_6]).log()
    counts = draw_counts(SamplingParams(seed=2, temperature=0.7), logits)
    assert chi_square_p_value(counts, torch.tensor(PROBS_6)) < 1e-3


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(seed=11, top_k=3),
        SamplingParams(seed=12, top_p=0.5),
        SamplingParams(seed=13, min_p=0.3),
        SamplingParams(seed=14, temperature=2.0, top_k=10, top_p=0.7),
    ],
)
def test_filtered_tokens_are_never_drawn(params):
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    counts = draw_counts(params, logits, num_draws=5_000)
    allowed = processed_probs(params, logits) > 0
    assert counts[~allowed].sum() == 0
    assert 1 < int(allowed.sum()) < 64


def draw_sequence(params: SamplingParams, num_steps: int = 40) -> list[int]:
    sampler = Sampler(params, "cpu")
    logits = torch.zeros(1, 100)
    return [int(sampler(logits, NO_CONTEXT).token_ids[0]) for _ in range(num_steps)]


def test_same_seed_same_tokens_different_seed_different_tokens():
    params = SamplingParams(seed=1234, temperature=1.2)
    assert draw_sequence(params) == draw_sequence(params)
    assert draw_sequence(params) != draw_sequence(SamplingParams(seed=1235, temperature=1.2))


def test_no_seed_picks_one_and_exposes_it():
    first = Sampler(SamplingParams(), "cpu")
    second = Sampler(SamplingParams(), "cpu")
    assert first.seed != second.seed
    assert draw_sequence(SamplingParams(seed=first.seed)) == draw_sequence(SamplingParams(seed=first.seed))


def test_seeds_stay_within_what_a_browser_reads_exactly():
    """A drawn seed travels in JSON to the pages, whose numbers are doubles: one past 2**53 showed
    rounded ("8648170272581798000") and a copied seed did not replay. Drawn and given seeds
    stay within MAX_SEED; a larger one is refused naming `seed`."""
    assert MAX_SEED == 2**53 - 1  # JavaScript's Number.MAX_SAFE_INTEGER
    drawn = [Sampler(SamplingParams(), "cpu").seed for _ in range(50)]
    assert all(0 <= seed <= MAX_SEED for seed in drawn), max(drawn)
    largest = SamplingParams(seed=MAX_SEED, temperature=1.2)
    assert draw_sequence(largest) == draw_sequence(largest)  # torch's generator takes it
    with pytest.raises(ValueError, match=rf"seed={MAX_SEED + 1} must be between 0 and {MAX_SEED}"):
        SamplingParams(seed=MAX_SEED + 1)
    # the choices of one seeded prompt (seed, seed + 1, ...) wrap within it too
    assert _choice_seeds(SamplingParams(seed=MAX_SEED), 2) == [MAX_SEED, 0]


@pytest.mark.parametrize("params", [SamplingParams(greedy=True), SamplingParams(temperature=0.0)])
def test_greedy_is_argmax_whatever_the_seed(params):
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(5))
    context = torch.empty(3, 0, dtype=torch.long)
    for seed in (1, 2, 3):
        out = Sampler(replace(params, seed=seed), "cpu")(logits, context)
        assert torch.equal(out.token_ids, logits.argmax(dim=-1))


def test_greedy_takes_the_first_of_tied_tokens():
    out = Sampler(SamplingParams(greedy=True), "cpu")(torch.tensor([[1.0, 3.0, 3.0, 2.0]]), NO_CONTEXT)
    assert out.token_ids.tolist() == [1]


def test_greedy_applies_the_repetition_penalty():
    sampler = Sampler(SamplingParams(greedy=True, repetition_penalty=1.5), "cpu")
    out = sampler(torch.tensor([[2.0, 1.9, 0.0]]), torch.tensor([[0]]))
    assert out.token_ids.tolist() == [1]


def test_output_logprobs_are_raw_and_processed_in_float32():
    logits = torch.randn(2, 30, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    params = SamplingParams(seed=0, temperature=0.5, top_k=4)
    out = Sampler(params, "cpu")(logits, torch.empty(2, 0, dtype=torch.long))
    assert out.logprobs.dtype == out.raw_logprobs.dtype == torch.float32
    assert torch.allclose(out.raw_logprobs, torch.log_softmax(logits.float(), dim=-1))
    processed = apply_processors(build_processors(params), logits.float(), NO_CONTEXT)
    assert torch.allclose(out.logprobs, torch.log_softmax(processed, dim=-1))
    assert (torch.isfinite(out.logprobs).sum(dim=-1) == 4).all()
    chosen = out.logprobs.gather(1, out.token_ids[:, None])
    assert torch.isfinite(chosen).all()


def test_top_alternatives_sorted_and_without_filtered_tokens():
    logprobs = torch.tensor([-2.0, -0.5, -math.inf, -1.0, -math.inf])
    assert top_alternatives(logprobs, 2) == ([1, 3], [-0.5, -1.0])
    assert top_alternatives(logprobs, 10) == ([1, 3, 0], [-0.5, -1.0, -2.0])
    assert top_alternatives(logprobs, 0) == ([], [])


def test_entropy_in_nats_ignores_filtered_tokens():
    uniform_3 = torch.full((3,), 1 / 3).log()
    two_of_three = torch.tensor([0.5, 0.5, 0.0]).log()
    one_hot = torch.tensor([0.0, 1.0, 0.0]).log()
    result = entropy(torch.stack([uniform_3, two_of_three, one_hot]))
    assert result.shape == (3,)
    assert result.tolist() == pytest.approx([math.log(3), math.log(2), 0.0])
    assert not result.isnan().any()


def test_token_rank_is_one_based_and_ties_favour_the_token():
    logprobs = torch.tensor([-1.0, -0.5, -0.5, -2.0])
    assert [token_rank(logprobs, i) for i in range(4)] == [3, 1, 1, 4]
