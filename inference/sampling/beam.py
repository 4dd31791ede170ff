"""Beam search with the semantics of transformers 5.x `generate(num_beams=..., do_sample=False)`.

Owns: the beam bookkeeping (`BeamSearchState`: which continuations survive, which hypotheses
are finished, when the search can stop) and the loop that drives a Hugging Face causal LM with
a `DynamicCache` (`beam_search`), yielding `Prefilled`, one `BeamStep` per step, `Finished`.
Must not know: sampling, tokenizers (text comes from the `decode` callable), Django.

Semantics follow transformers' `GenerationMixin._beam_search` step for step, including its
-1e9 "masked" scores, so sequences and scores match `generate` (see tests/engine/test_beam.py):
- each step keeps the best `(1 + num_eos) * num_beams` (at least 2 * num_beams) continuations
  of all beams by summed logprob; the best `num_beams` that did not just finish run on;
- a continuation ending in EOS, reaching `max_length`, or (our addition) whose text contains a
  stop string is finished; only those among the best `num_beams` continuations may enter the
  `num_beams` best finished hypotheses, scored sum(logprobs) / num_generated ** length_penalty;
- the search ends when every continuation finished, when `early_stopping` is on and
  `num_beams` hypotheses are finished, or when the best running beam can no longer beat the
  worst finished one (transformers' heuristic for `early_stopping=False`).
`repetition_penalty` is supported as transformers applies it under beam search: on the
logprobs, over prompt + beam tokens. Temperature, top-k/p, min-p and the seed do not apply.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from inference.events import Beam, BeamStep, Finished, FinishReason, Prefilled
from inference.kv.cache import dynamic_cache_nbytes
from inference.sampling.logits import RepetitionPenalty
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
            logprobs = self.penalty(logprobs, self.context_ids())
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


@dataclass
class _Clock:
    """perf_counter() readings of one search."""

    start: float
    prefill_done: float = 0.0
    first_step_done: float = 0.0


@torch.inference_mode()
def beam_search(
    model,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    eos_token_ids: tuple[int, ...],
    decode: Callable[[list[int]], str],
    max_length: int,
    should_cancel: Callable[[], bool] | None = None,
) -> Iterator[Prefilled | BeamStep | Finished]:
    """Runs beam search on a Hugging Face causal LM; yields `Prefilled`, a `BeamStep` per step
    (the first from the prefill pass), then one `Finished`.

    `max_length` is the context limit (prompt + generated); generation also stops after
    `params.max_new_tokens`. `params.ignore_eos` empties `eos_token_ids`. `should_cancel` is
    checked after every step; when it returns True the search ends with "cancelled" and the
    live beams compete with the finished hypotheses for `Finished.sequences`.
    """
    if not prompt_ids:
        raise ValueError("beam search needs a non-empty prompt")
    if len(prompt_ids) >= max_length:
        raise ValueError(f"prompt of {len(prompt_ids)} tokens leaves no room in a {max_length}-token context")
    clock = _Clock(start=time.perf_counter())
    limit = min(max_length, len(prompt_ids) + params.max_new_tokens)
    eos_token_ids = () if params.ignore_eos else tuple(eos_token_ids)
    state = BeamSearchState(prompt_ids, params, eos_token_ids, limit, decode, model.device)
    cache = DynamicCache(config=model.config) if params.use_kv_cache else None
    # One prefill pass for the prompt, shared by all beams (transformers runs it num_beams times).
    logits = _next_logits(model, state.context_ids()[:1], cache).expand(params.num_beams, -1)
    clock.prefill_done = time.perf_counter()
    yield Prefilled(
        num_prompt_tokens=len(prompt_ids),
        num_cached_tokens=0,
        num_prefilled_tokens=len(prompt_ids),
        prefill_ms=_ms(clock.start, clock.prefill_done),
        kv_cache_bytes=dynamic_cache_nbytes(cache),
    )
    if cache is not None:
        cache.batch_repeat_interleave(params.num_beams)
    num_steps, step_start, is_cancelled = 0, clock.start, False
    while True:
        step = state.advance(logits)
        now = time.perf_counter()
        clock.first_step_done = clock.first_step_done or now
        yield BeamStep(
            index=num_steps,
            phase="decode" if num_steps else "prefill",
            beams=step.beams,
            latency_ms=_ms(step_start, now),
        )
        num_steps += 1
        is_cancelled = should_cancel is not None and should_cancel()
        if step.is_done or is_cancelled:
            break
        step_start = time.perf_counter()
        if cache is not None:
            cache.reorder_cache(step.beam_ids)
            logits = _next_logits(model, state.last_ids(), cache)
        else:
            logits = _next_logits(model, state.context_ids(), None)
    yield _finished(state, is_cancelled, max_length, clock, num_steps, dynamic_cache_nbytes(cache))


def _finished(
    state: BeamSearchState, is_cancelled: bool, context_length: int, clock: _Clock, num_steps: int, kv_cache_bytes: int
) -> Finished:
    sequences = state.best(include_running=is_cancelled)
    best = sequences[0] if sequences else None
    decode_s = time.perf_counter() - clock.prefill_done
    # Every step after the prefill one extends all beams by a token: count steps, not tokens.
    num_decode_steps = num_steps - 1
    return Finished(
        finish_reason="cancelled" if is_cancelled else state.finish_reason(best, context_length),
        text=best.text if best else "",
        token_ids=best.token_ids if best else (),
        num_prompt_tokens=len(state.prompt_ids),
        num_cached_tokens=0,
        num_generated_tokens=len(best.token_ids) if best else 0,
        prefill_ms=_ms(clock.start, clock.prefill_done),
        ttft_ms=_ms(clock.start, clock.first_step_done),
        decode_ms=decode_s * 1000,
        decode_tok_s=num_decode_steps / decode_s if decode_s > 0 else 0.0,
        kv_cache_bytes=kv_cache_bytes,
        sequences=tuple(sequences),
    )


def _next_logits(model, input_ids: torch.Tensor, cache: DynamicCache | None) -> torch.Tensor:
    """(B, T) ids -> (B, V) float32 logits of the last position; appends T tokens to `cache`."""
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=cache is not None, logits_to_keep=1)
    return out.logits[:, -1].float()


def _ms(start: float, end: float) -> float:
    return (end - start) * 1000
