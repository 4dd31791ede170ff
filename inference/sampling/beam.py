"""Beam search with the semantics of transformers 5.x `generate(num_beams=..., do_sample=False)`.

Owns: the beam bookkeeping (`BeamSearchState`: which continuations survive, which hypotheses
are finished, when the search can stop), fed one logits row per beam each step. The beams run
in the batch as sequences that share KV blocks (`inference.beams` drives them).
Must not know: models, caches, sampling, tokenizers (text comes from the `decode` callable), Django.

Semantics follow transformers' `GenerationMixin._beam_search` step for step, including its
-1e9 "masked" scores, so sequences and scores match `generate` (see tests/inference/sampling/test_beam.py):
- each step keeps the best `(1 + num_eos) * num_beams` (at least 2 * num_beams) continuations
  of all beams by summed logprob; the best `num_beams` that did not just finish run on;
- a continuation ending in EOS, reaching `max_length`, or (our addition) whose text contains a
  stop string is finished; only those among the best `num_beams` continuations may enter the
  `num_beams` best finished hypotheses, scored sum(logprobs) / num_generated ** length_penalty;
- the search ends when every continuation finished, when `early_stopping` is on and
  `num_beams` hypotheses are finished, or when the best running beam can no longer beat the
  worst finished one (transformers' heuristic for `early_stopping=False`).
`repetition_penalty` is supported as transformers applies it under beam search: on the
logprobs, over prompt + beam tokens (the beam's tokens only with `penalize_prompt` off).
Temperature, top-k/p, min-p and the seed do not apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from inference.events import Beam, FinishReason
from inference.sampling.logits import RepetitionPenalty, penalized_ids
from inference.sampling_params import SamplingParams

MASKED = -1.0e9  # transformers' stand-in for "not a candidate"; kept so tie-breaks match it
ROOT_PARENT = -1  # `Beam.parent` of the first step's beams: they all extend the prompt


@dataclass(frozen=True)
class StepResult:
    """What one `BeamSearchState.advance` decided, for the caller to report and act on."""

    beams: tuple[Beam, ...]  # live beams (best first), then hypotheses finished this step
    beam_ids: torch.Tensor  # (num_beams,) parent row of each running beam: the cache reorder
    is_done: bool


class BeamSearchState:
    """Beam bookkeeping for one prompt; no model, no cache: feed it each step's logits."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        eos_token_ids: tuple[int, ...],
        max_length: int,
        decode: Callable[[list[int]], str],
        device: torch.device | str = "cpu",
    ):
        self.params = params
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_length = max_length
        self.decode = decode
        self.prompt_ids = torch.tensor(prompt_ids, dtype=torch.long, device=device)
        num_beams = params.num_beams
        self.num_candidates = max(2, 1 + len(self.eos_token_ids)) * num_beams
        self.penalty = RepetitionPenalty(params.repetition_penalty) if params.repetition_penalty != 1.0 else None
        self.num_generated = 0
        self.running_tokens: list[tuple[int, ...]] = [()] * num_beams
        # Each candidate path's per-token logprobs, keyed by its tokens (a path's tokens fix them).
        self.path_logprobs: dict[tuple[int, ...], tuple[float, ...]] = {(): ()}
        # Only the first beam is live at the start, so the first step does not pick one token num_beams times.
        self.running_scores = torch.full((num_beams,), MASKED, device=device)
        self.running_scores[0] = 0.0
        self.finished_tokens: list[tuple[int, ...]] = [()] * num_beams
        self.finished_scores = torch.full((num_beams,), MASKED, device=device)
        self.is_finished = torch.zeros(num_beams, dtype=torch.bool, device=device)
        self.can_improve = True
        self.is_top_candidate = torch.arange(self.num_candidates, device=device) < num_beams

    def context_ids(self) -> torch.Tensor:
        """(num_beams, T): prompt + each running beam's tokens; the next forward's input."""
        num_beams = len(self.running_tokens)
        generated = torch.tensor(self.running_tokens, dtype=torch.long, device=self.prompt_ids.device)
        generated = generated.reshape(num_beams, self.num_generated)
        return torch.cat([self.prompt_ids.expand(num_beams, -1), generated], dim=1)

    def last_ids(self) -> torch.Tensor:
        """(num_beams, 1): each running beam's newest token; the next forward's input with a cache."""
        return torch.tensor([[tokens[-1]] for tokens in self.running_tokens], device=self.prompt_ids.device)

    def advance(self, logits: torch.Tensor) -> StepResult:
        """`logits` (num_beams, V): each running beam's next-token logits."""
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        if self.penalty is not None:
            logprobs = self.penalty(logprobs, penalized_ids(self.context_ids(), len(self.prompt_ids), self.params))
        vocab_size = logprobs.shape[-1]
        summed = (logprobs + self.running_scores[:, None]).view(-1)
        cand_scores, flat_ids = torch.topk(summed, self.num_candidates)
        cand_parents = (flat_ids // vocab_size).tolist()
        cand_tokens = [self.running_tokens[b] + (t,) for b, t in zip(cand_parents, (flat_ids % vocab_size).tolist())]
        self._remember_logprobs(cand_tokens, logprobs.reshape(-1)[flat_ids].tolist())
        cand_is_done = torch.tensor([self._is_done(c) for c in cand_tokens], device=cand_scores.device)
        self.num_generated += 1

        next_running = torch.topk(cand_scores + cand_is_done.float() * MASKED, self.params.num_beams).indices
        new_finished = self._update_finished(cand_tokens, cand_scores, cand_is_done)
        self.running_tokens = [cand_tokens[i] for i in next_running.tolist()]
        self.running_scores = (cand_scores + cand_is_done.float() * MASKED)[next_running]
        self._update_can_improve()

        live = [
            self._beam(cand_tokens[i], self._penalized(cand_scores[i]), cand_parents[i])
            for i in next_running.tolist()
            if not cand_is_done[i]
        ]
        finished = [self._beam(cand_tokens[i], score, cand_parents[i], is_finished=True) for i, score in new_finished]
        is_done = (
            not self.can_improve
            or (self.params.early_stopping and bool(self.is_finished.all()))
            or bool(cand_is_done.all())
        )
        beam_ids = torch.tensor(cand_parents, device=next_running.device)[next_running]
        return StepResult(beams=tuple(live + finished), beam_ids=beam_ids, is_done=is_done)

    def _remember_logprobs(self, cand_tokens: list[tuple[int, ...]], cand_logprobs: list[float]) -> None:
        for tokens, logprob in zip(cand_tokens, cand_logprobs):
            self.path_logprobs[tokens] = self.path_logprobs[tokens[:-1]] + (logprob,)

    def _is_done(self, tokens: tuple[int, ...]) -> bool:
        return (
            tokens[-1] in self.eos_token_ids
            or len(self.prompt_ids) + len(tokens) >= self.max_length
            or self._stop_index(tokens) is not None
        )

    def _stop_index(self, tokens: tuple[int, ...]) -> int | None:
        """Where the first stop string starts in the decoded text, or None."""
        if not self.params.stop:
            return None
        text = self.decode(list(tokens))
        found = [i for i in (text.find(s) for s in self.params.stop) if i >= 0]
        return min(found) if found else None

    def _penalized(self, summed_logprob: torch.Tensor) -> float:
        return float(summed_logprob / (self.num_generated**self.params.length_penalty))

    def _update_finished(
        self, cand_tokens: list[tuple[int, ...]], cand_scores: torch.Tensor, cand_is_done: torch.Tensor
    ) -> list[tuple[int, float]]:
        """Merges this step's finished candidates into the best `num_beams` hypotheses; returns the
        (candidate index, score) of those that got in."""
        is_eligible = cand_is_done & self.is_top_candidate
        scores = cand_scores / (self.num_generated**self.params.length_penalty)
        is_full = bool(self.is_finished.all()) and self.params.early_stopping
        scores = scores + float(is_full) * MASKED
        scores = scores + float(not self.can_improve) * MASKED
        scores = scores + (~is_eligible).float() * MASKED
        num_old = len(self.finished_tokens)
        merged_scores = torch.cat([self.finished_scores, scores])
        keep = torch.topk(merged_scores, self.params.num_beams).indices.tolist()
        merged_tokens = self.finished_tokens + cand_tokens
        merged_is_finished = torch.cat([self.is_finished, is_eligible])
        self.finished_tokens = [merged_tokens[i] for i in keep]
        self.finished_scores = merged_scores[keep]
        self.is_finished = merged_is_finished[keep]
        return [(i - num_old, float(merged_scores[i])) for i in keep if i >= num_old and merged_is_finished[i]]

    def _update_can_improve(self) -> None:
        best_possible = self.running_scores[0] / (self.num_generated**self.params.length_penalty)
        worst_finished = torch.where(self.is_finished, self.finished_scores.min(), MASKED)
        self.can_improve = self.can_improve and bool((best_possible > worst_finished).any())

    def _beam(self, tokens: tuple[int, ...], score: float, parent: int, is_finished: bool = False) -> Beam:
        parent = ROOT_PARENT if self.num_generated == 1 else parent
        return Beam(
            token_ids=tokens,
            text=self.text(tokens),
            score=score,
            parent=parent,
            is_finished=is_finished,
            token_logprobs=self.path_logprobs[tokens],
        )

    def text(self, tokens: tuple[int, ...]) -> str:
        """The answer's text: a final EOS is not text, and a stop string and what follows are cut."""
        if tokens and tokens[-1] in self.eos_token_ids:
            tokens = tokens[:-1]
        text = self.decode(list(tokens))
        stop_at = self._stop_index(tokens)
        return text if stop_at is None else text[:stop_at]

    def best(self, include_running: bool) -> list[Beam]:
        """The `num_return_sequences` best hypotheses, best first. With `include_running` (a
        cancelled search) the live beams compete too, scored as if they had finished now."""
        finished = zip(self.finished_scores, self.finished_tokens, self.is_finished)
        hypotheses = [(float(s), t) for s, t, is_finished in finished if is_finished]
        if include_running or not hypotheses:
            hypotheses += [
                (self._penalized(s), t)
                for s, t in zip(self.running_scores, self.running_tokens)
                if s > MASKED / 2 and t
            ]
        hypotheses.sort(key=lambda h: -h[0])
        # `parent` means nothing outside a BeamStep; ROOT_PARENT says so.
        return [
            self._beam(t, s, ROOT_PARENT, is_finished=True) for s, t in hypotheses[: self.params.num_return_sequences]
        ]

    def finish_reason(self, best: Beam | None, context_length: int) -> FinishReason:
        """Why `best` ended; "context" when it ran into `context_length`, the model's limit."""
        if best is None or not best.token_ids:
            return "length"
        if best.token_ids[-1] in self.eos_token_ids:
            return "eos"
        if self._stop_index(best.token_ids) is not None:
            return "stop_string"
        is_cut_by_context = (
            len(self.prompt_ids) + len(best.token_ids) >= context_length
            and len(best.token_ids) < self.params.max_new_tokens
        )
        return "context" if is_cut_by_context else "length"
