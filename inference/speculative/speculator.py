"""Speculative decoding in the batch: proposals before a step, their verdicts after it.

Owns: each speculating request's proposer and counts (`Speculation`), the step-cost line, and
`propose`: before the scheduler runs, every decoding request that speculates gets the proposed
tokens worth verifying (`policy.choose_k`) appended to its sequence; the pass then computes them
like a small prefill, and `inference.speculative.verify` keeps what the model would have chosen.
Must not know: models, the scheduler's policy, Django.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from inference.core.scheduler import Chunk, Scheduler, SchedulerOutput
from inference.core.sequence import Sequence
from inference.events import Step
from inference.requests import Request, Vocabulary
from inference.sampling_params import MAX_SPECULATIVE_TOKENS, PROMPT_LOOKUP, SPECULATIVE_OFF, SamplingParams
from inference.speculative.policy import PROBE_EVERY, Acceptance, StepCost, choose_k, expected_tokens
from inference.speculative.proposers import PredictionLookup, PromptLookup, Proposal
from inference.speculative.verify import take_verified


class Proposer(Protocol):
    name: str
    kind: str  # its proposals' kind (`Proposal.kind`): the lookups say per proposal
    draft_ms: float  # what each proposed token costs to make (a draft model's pass; 0: a lookup)

    def propose(self, token_ids: list[int], num_generated: int, max_tokens: int) -> Proposal | None: ...


# A draft model's proposer for a request: (the request's params, its prompt ids) -> a proposer.
DraftFactory = Callable[[SamplingParams, list[int]], Proposer]


@dataclass
class Speculation:
    """One request's proposer, this step's proposal and what its verifications gave."""

    proposer: Proposer
    fixed_k: int | None  # the request's `num_speculative_tokens`; None: chosen per pass
    acceptance: Acceptance = field(default_factory=Acceptance)
    proposal: Proposal | None = None  # on the sequence now, verified by this step
    saved_ms: float = 0.0  # what its tokens would have cost as plain decode steps, less what the passes did


class Speculator:
    def __init__(self, max_context: int) -> None:
        self.max_context = max_context
        self.cost = StepCost()
        self.drafts: dict[str, DraftFactory] = {}  # draft model name -> its proposers' factory
        self.states: dict[int, Speculation] = {}  # request id -> its speculation
        self.step_ms = 0.0  # the last step's forward pass
        self.plain_ms = 0.0  # the last step's cost without its proposed tokens (the cost line)

    def check(self, params: SamplingParams) -> None:
        """A ValueError naming `speculative` when it names no draft this engine has."""
        if params.speculative not in (SPECULATIVE_OFF, PROMPT_LOOKUP) and params.speculative not in self.drafts:
            known = ", ".join(["off", "prompt_lookup", *sorted(self.drafts)])
            raise ValueError(f"speculative={params.speculative!r} is not a draft model of this engine ({known})")

    def add(self, request: Request, tokenizer) -> None:
        params = request.params
        if not params.is_speculative:
            return
        if params.prediction:
            prediction_ids = tokenizer.encode(params.prediction, add_special_tokens=False)
            proposer: Proposer = PredictionLookup(list(prediction_ids))
        elif params.speculative == PROMPT_LOOKUP:
            proposer = PromptLookup()
        else:
            proposer = self.drafts[params.speculative](params, request.prompt_ids)
        self.states[request.request_id] = Speculation(proposer, params.num_speculative_tokens)

    def forget(self, request_id: int) -> None:
        state = self.states.pop(request_id, None)
        close = getattr(state.proposer, "close", None) if state else None
        if close is not None:
            close()

    def propose(self, running: list[Sequence], owners: Mapping[int, Any]) -> None:
        """Proposed tokens for each speculating request that decodes in this step (`running`:
        the scheduler's sequences; `owners`: the request of each by seq_id), as many as pay for
        themselves in a step of that many decodes (or its `num_speculative_tokens`)."""
        if not self.states:
            return
        decoding = [s for s in running if s.num_uncomputed_tokens == 1]
        speculating = [owners[s.seq_id] for s in decoding if s.seq_id in owners]
        speculating = [r for r in speculating if r.request_id in self.states and not r.forks]
        num_step_tokens, num_step_yield = len(decoding), float(len(decoding))
        for request in speculating:
            state, seq = self.states[request.request_id], request.seq
            state.proposal = None
            room = min(
                state.fixed_k or MAX_SPECULATIVE_TOKENS,
                request.params.max_new_tokens - len(request.generated_ids) - 1,  # the pass's own token is one more
                self.max_context - seq.num_tokens - 1,
            )
            proposer, acceptance = state.proposer, state.acceptance
            if proposer.draft_ms:  # each proposed token costs a draft pass: decide k before making them
                k = self._k(state, proposer.kind, room, num_step_tokens, num_step_yield, proposer.draft_ms)
                room = k
            proposal = proposer.propose(seq.token_ids, len(request.generated_ids), room) if room > 0 else None
            if proposal is None:
                continue
            k = self._k(state, proposal.kind, len(proposal.token_ids), num_step_tokens, num_step_yield)
            if k == 0:
                continue
            rate = acceptance.rate(proposal.kind)
            state.proposal = replace(proposal, token_ids=proposal.token_ids[:k], draft_probs=proposal.draft_probs[:k])
            seq.add_drafts(state.proposal.token_ids)
            num_step_tokens += k
            num_step_yield += expected_tokens(rate, k) - 1

    def _k(self, state: Speculation, kind: str, available: int, num_tokens: int, num_yield: float, draft_ms=0.0) -> int:
        """The request's `num_speculative_tokens`, else the k worth verifying now (and one now and
        then after a run of none, to measure again: the text may have turned to quoting)."""
        if state.fixed_k:
            return available
        acceptance = state.acceptance
        k = choose_k(acceptance.rate(kind), available, self.cost, num_tokens, num_yield, draft_ms)
        acceptance.num_skipped = 0 if k else acceptance.num_skipped + 1
        if acceptance.num_skipped > PROBE_EVERY and available:
            k, acceptance.num_skipped = 1, 0
        return k

    def observe_step(self, out: SchedulerOutput, forward_ms: float) -> None:
        """A step's size and time: decode steps price the cost line."""
        num_drafts = sum(c.num_draft_tokens for c in out.chunks)
        if all(c.kind == "decode" for c in out.chunks):
            self.cost.observe(out.num_batched_tokens, forward_ms)
        self.step_ms = forward_ms
        # (only a verification reads it: a step without proposals fits no line)
        self.plain_ms = self.cost.ms(out.num_batched_tokens - num_drafts) if num_drafts else 0.0

    def verify(
        self,
        request: Request,
        chunk: Chunk,
        logits: torch.Tensor,
        routing: list[Any],
        vocab: Vocabulary,
        latency_ms: float,
        kv_bytes: int,
        scheduler: Scheduler,
    ) -> list[Step]:
        """The request's steps from its verification pass (`logits` (d + 1, vocab): its chunk's
        rows); its proposed tokens off its sequence, the accepted ones' KV kept, the rest given back."""
        state = self.states[request.request_id]
        proposal, state.proposal = state.proposal, None
        assert proposal is not None, f"request {request.request_id} verifies no proposal"
        num_drafts = chunk.num_draft_tokens  # the scheduler may have kept fewer than were proposed
        proposal = replace(
            proposal, token_ids=proposal.token_ids[:num_drafts], draft_probs=proposal.draft_probs[:num_drafts]
        )
        request.seq.drop_drafts()
        steps, num_accepted = take_verified(request, proposal, logits, routing, vocab, latency_ms, kv_bytes)
        state.acceptance.observe(proposal.kind, num_drafts, num_accepted)
        state.saved_ms += len(steps) * self.plain_ms - self.step_ms
        # The last token taken has no KV when the model chose it; when it was an accepted proposal
        # (the answer ended on it) it has, and computing it again costs nothing that matters.
        scheduler.accept_drafts(request.seq, min(num_accepted, len(steps) - 1))
        return steps

    def summary(self, request_id: int, decode_ms: float) -> dict[str, float | int]:
        """The `Finished` record's speculation fields (none for a request that did not speculate)."""
        state = self.states.get(request_id)
        if state is None:
            return {}
        acceptance = state.acceptance
        speedup = (decode_ms + state.saved_ms) / decode_ms if decode_ms > 0 else 1.0
        return {
            "num_proposed_tokens": acceptance.num_proposed,
            "num_accepted_tokens": acceptance.num_accepted,
            "speculative_speedup": round(max(speedup, 0.0), 3),
        }
