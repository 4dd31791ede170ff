"""inference.speculative's proposers and policy as plain functions: n-gram lookup, predictions,
acceptance and the choice of k from a step-cost line."""

from __future__ import annotations

import numpy as np

from inference.speculative.policy import Acceptance, StepCost, choose_k, expected_tokens
from inference.speculative.proposers import PredictionLookup, PromptLookup, lookup


def test_lookup_takes_the_longest_tail_and_its_latest_occurrence() -> None:
    source = np.array([1, 2, 3, 9, 2, 3, 8, 1, 2, 3])
    # "1 2 3" occurs at 0 (followed by 9); "2 3" last at 4 (followed by 8): the longer match wins
    assert lookup(source, source, 2) == ([9, 2], 3)
    assert lookup(np.array([5, 6, 5, 6]), np.array([6]), 3) == ([5, 6], 1)  # latest "6" followed by a token: index 1
    assert lookup(np.array([1, 2, 3]), np.array([7]), 3) == ([], 0)
    assert lookup(np.array([1, 2, 3]), np.array([3]), 3) == ([], 0)  # its own end is no earlier occurrence
    assert lookup(source, source, 0) == ([], 0)


def test_prompt_lookup_proposes_what_followed_the_answers_last_tokens_in_the_prompt() -> None:
    proposal = PromptLookup().propose([10, 11, 12, 13, 14, 99, 10, 11], num_generated=2, max_tokens=3)
    assert proposal is not None
    assert (proposal.token_ids, proposal.kind, proposal.draft_probs) == ([12, 13, 14], "ngram2", [1.0] * 3)
    assert PromptLookup().propose([1, 2, 3, 4], num_generated=1, max_tokens=3) is None


def test_a_prediction_is_proposed_word_for_word_then_realigned_after_a_difference() -> None:
    prediction = PredictionLookup([20, 21, 22, 23, 24, 25])
    at_start = prediction.propose([1, 2], num_generated=0, max_tokens=3)
    assert at_start is not None and (at_start.token_ids, at_start.kind) == ([20, 21, 22], "aligned")
    following = prediction.propose([1, 2, 20, 21], num_generated=2, max_tokens=10)
    assert following is not None and following.token_ids == [22, 23, 24, 25]
    # the answer wrote 77 where the prediction had 22, then went on with 23: realigned after "23"
    realigned = prediction.propose([1, 20, 21, 77, 23], num_generated=4, max_tokens=2)
    assert realigned is not None and (realigned.token_ids, realigned.kind) == ([24, 25], "ngram1")
    assert prediction.propose([1, 20, 21, 22, 23, 24, 25], num_generated=6, max_tokens=3) is None  # all used


def test_acceptance_starts_at_the_kinds_prior_and_follows_what_was_measured() -> None:
    acceptance = Acceptance()
    assert acceptance.rate("ngram4") > acceptance.rate("ngram1")
    before = acceptance.rate("ngram2")
    for _ in range(10):
        acceptance.observe("ngram2", 4, 0)
    assert acceptance.rate("ngram2") < before / 3
    for _ in range(10):
        acceptance.observe("ngram2", 4, 4)
    assert acceptance.rate("ngram2") > 0.8  # recent passes weigh most: quoting again
    assert (acceptance.num_proposed, acceptance.num_accepted) == (80, 40)


def test_expected_tokens() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12


def line(fixed_ms: float, per_token_ms: float) -> StepCost:
    cost = StepCost()
    for n in (1, 2, 4, 8, 16):
        cost.observe(n, fixed_ms + per_token_ms * n)
    return cost


def test_k_is_large_on_a_memory_bound_step_and_zero_on_a_compute_bound_one() -> None:
    memory_bound = line(fixed_ms=30.0, per_token_ms=1.0)
    assert np.allclose(memory_bound.line(), (30.0, 1.0))
    assert choose_k(0.8, 8, memory_bound, num_step_tokens=1, num_step_yield=1.0) >= 6
    compute_bound = line(fixed_ms=2.0, per_token_ms=10.0)
    assert choose_k(0.6, 8, compute_bound, num_step_tokens=8, num_step_yield=8.0) == 0
    # a draft model's passes are part of the price
    assert choose_k(0.8, 8, memory_bound, 1, 1.0, draft_ms=30.0) < choose_k(0.8, 8, memory_bound, 1, 1.0)


def test_before_two_step_sizes_are_seen_an_extra_row_is_priced_by_the_prior() -> None:
    cost = StepCost()
    cost.observe(1, 40.0)
    cost.observe(1, 40.0)
    fixed, per_token = cost.line()
    assert abs(fixed + per_token - 40.0) < 1e-9 and per_token == 10.0
