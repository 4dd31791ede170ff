"""Verifying proposed tokens: the tokens the model itself chooses, as many as one pass gives.

Owns: walking a verification pass's logits rows in order. Row j predicts the token after the
j-th proposed one, so it is the row a plain decode step would have had, as long as every token
before it was the model's own choice. Each row is sampled exactly as a plain step samples it (the
request's processors, penalty context, grammar, thinking budget and generator, one uniform
number per token), and the token is taken like any other (stop strings, EOS, length). The walk
stops at the first row whose token is not the proposed one (that token is the model's: it
replaces the proposal), at the end, or when the request ends.

So the answer is the one the request gives without speculation, token for token, greedy or
sampled with a seed. For a sampled row this is the rejection rule of speculative sampling for a
proposal that is one token for sure (q = 1 there): the proposal is kept with probability
min(1, p/q) = p(x), and otherwise the token comes from the residual max(0, p - q), p without x,
renormalized; both are what one inverse-CDF draw from p with one uniform number gives.
Must not know: the batch, the scheduler, models.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from inference.events import ProposedToken, Step, Verification
from inference.requests import Request, Vocabulary
from inference.sampling.sampler import RowSample, sample_rows
from inference.speculative.proposers import Proposal


class VerifyFailed(ValueError):
    """The pass's first row could not be sampled (the settings left no token): the request ends."""


def take_verified(
    request: Request,
    proposal: Proposal,
    logits: torch.Tensor,
    routing: list[Any],
    vocab: Vocabulary,
    latency_ms: float,
    kv_bytes: int,
) -> tuple[list[Step], int]:
    """The request's steps from one verification pass of `logits` (d + 1, vocab), its proposed
    tokens already off its sequence; and how many proposed tokens were accepted."""
    draft_ids = proposal.token_ids
    taken: list[tuple[Step, RowSample]] = []
    for j in range(len(draft_ids) + 1):
        draft_id = draft_ids[j] if j < len(draft_ids) else None
        row = replace(request.row(), draft_token_id=draft_id)
        sample = sample_rows(logits[j : j + 1], [row])[0]
        if sample.error is not None:
            if not taken:
                raise VerifyFailed(sample.error)
            break  # the tokens so far stand; the next plain step meets the same settings
        step = request.take(row, sample, vocab, latency_ms, kv_bytes, routing[j])
        taken.append((step, sample))
        if draft_id is None or sample.token_id != draft_id or request.finish_reason(step, vocab) is not None:
            break
    num_accepted = sum(1 for j, (step, _) in enumerate(taken) if j < len(draft_ids) and step.token_id == draft_ids[j])
    proposed = tuple(
        ProposedToken(
            token_id=draft_id,
            piece=vocab.table.piece_of(draft_id),
            draft_prob=proposal.draft_probs[j],
            prob=math.exp(taken[j][1].draft_logprob) if j < len(taken) else None,
            is_accepted=j < num_accepted,
        )
        for j, draft_id in enumerate(draft_ids)
    )
    share_ms = latency_ms / len(taken)
    steps = [
        replace(step, latency_ms=share_ms, verification=Verification(proposal.source, proposed, num_accepted, j))
        for j, (step, _) in enumerate(taken)
    ]
    return steps, num_accepted
