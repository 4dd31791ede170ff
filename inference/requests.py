"""One request's life, from its first sampled row to its `Finished` (or its handoff).

Owns: the per-request state beside the scheduler's `Sequence` (its sampler and generator, the
incremental detokenizer, stop strings, the thinking budget, timings), turning a sampled row
into the `Step` record, the finish rules (EOS, stop string, length, context), the held-back
text released on the last step, the `Finished` record, and packing/unpacking a prefill/decode
`Handoff`. One module, so every path (batched, forked, handed over) ends the same way.
Must not know: models, the KV pool, the scheduler's policy, Django.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from inference.core.sequence import Sequence
from inference.events import Alternative, Finished, Prefilled, Step
from inference.kv.paged import LayerKV
from inference.kv.transfer import Handoff
from inference.sampling.grammar import GrammarMatcher
from inference.sampling.logits import penalized_ids
from inference.sampling.sampler import Row, RowSample, Sampler
from inference.sampling.stopping import StopStringMatcher
from inference.sampling.thinking import ThinkingTracker
from inference.sampling_params import SamplingParams
from inference.text.reasoning import prompt_opens_reasoning
from inference.text.tokenization import IncrementalDetokenizer, TokenTable
from inference.vision.images import PromptImage
from inference.vision.spans import ImageSpan


@dataclass(frozen=True)
class Vocabulary:
    """What a request's records need of the model's tokenizer and limits."""

    tokenizer: Any
    table: TokenTable
    eos_token_ids: tuple[int, ...]
    think_close_ids: tuple[int, ...]  # `</think>` as the thinking budget forces it
    max_context: int
    vocab_size: int = 0  # the logits' width (0: the tokenizer's length); a grammar's mask covers it

    @property
    def num_logits(self) -> int:
        return self.vocab_size or len(self.tokenizer)

    def opens_reasoning(self, token_ids: Seq[int]) -> bool:
        """Whether the tokens leave a `<think>` open (R1's template ends with one), read from the
        tokens' own text so a tag the tokenizer treats as special counts too."""
        raw = b"".join(self.table.bytes_of(i) for i in token_ids)
        return prompt_opens_reasoning(raw.decode("utf-8", errors="replace"))

    def alternatives(self, pairs: Seq[tuple[int, float]]) -> tuple[Alternative, ...]:
        return tuple(Alternative(i, self.table.piece_of(i), math.exp(lp), lp) for i, lp in pairs)


@dataclass
class Request:
    """A request's state; its `seq` is what the scheduler and block manager see."""

    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    seq: Sequence
    sampler: Sampler
    detokenizer: IncrementalDetokenizer
    stopper: StopStringMatcher
    thinking: ThinkingTracker
    arrived_at: float = field(default_factory=time.perf_counter)
    generated_ids: list[int] = field(default_factory=list)
    text: str = ""
    prefilled: Prefilled | None = None
    first_token_at: float | None = None
    prefill_started_at: float | None = None
    ttft_ms: float = 0.0
    images: tuple[PromptImage, ...] = ()  # their pixels, for every pass over their tokens
    image_spans: tuple[ImageSpan, ...] = ()
    prefill_only: bool = False  # ends after its first token, exported for a decode worker
    handoff: Handoff | None = None  # handed over: its KV waits to be loaded into its blocks
    is_cancelled: bool = False
    forks: list[Request] = field(default_factory=list)  # parallel sampling: started from this one's prefill
    grammar: GrammarMatcher | None = None  # `params.grammar`'s parser state: it masks each row, then advances

    @classmethod
    def new(
        cls,
        request_id: int,
        prompt_ids: list[int],
        params: SamplingParams,
        vocab: Vocabulary,
        device: torch.device,
        *,
        seed: int | None = None,
        images: Seq[PromptImage] = (),
        image_spans: Seq[ImageSpan] = (),
    ) -> Request:
        seq = Sequence(
            list(prompt_ids),
            params,
            atomic_spans=tuple((s.start, s.end) for s in image_spans),
            key_overrides=tuple((s.start, s.end, s.cache_key) for s in image_spans),
        )
        return cls(
            request_id=request_id,
            prompt_ids=list(prompt_ids),
            params=params,
            seq=seq,
            sampler=Sampler(params if seed is None else replace(params, seed=seed), device),
            detokenizer=IncrementalDetokenizer(vocab.tokenizer, skip_special_tokens=True),
            stopper=StopStringMatcher(params.stop),
            thinking=ThinkingTracker(
                vocab.think_close_ids, params.max_thinking_tokens, is_open=vocab.opens_reasoning(prompt_ids)
            ),
            images=tuple(images),
            image_spans=tuple(image_spans),
            grammar=GrammarMatcher(params.grammar, vocab.tokenizer, vocab.num_logits) if params.grammar else None,
        )

    # ---- each step -------------------------------------------------------------------------

    def prefilled_record(self, kv_bytes: int) -> Prefilled:
        """Its `Prefilled` record, as its first token is taken."""
        seq, now = self.seq, time.perf_counter()
        return Prefilled(
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_prefilled_tokens=seq.num_prompt_tokens - seq.num_cached_tokens,
            prefill_ms=(now - (self.prefill_started_at or now)) * 1000,
            kv_cache_bytes=kv_bytes,
            queue_ms=((seq.first_scheduled_at or now) - self.arrived_at) * 1000,
        )

    def row(self) -> Row:
        """This step's sampling row: the thinking budget may force its token (it is sampled all
        the same, so the random stream stays the one the same seed gives)."""
        context_ids = penalized_ids(self.seq.token_ids, self.seq.num_prompt_tokens, self.params)
        forced = self.thinking.forced_token()
        return Row(self.sampler, context_ids, forced, self.params.num_alternatives, self.grammar)

    def take(self, row: Row, sample: RowSample, vocab: Vocabulary, latency_ms: float, kv_bytes: int, routing) -> Step:
        """Appends the row's token; its `Step` record."""
        token_id = sample.token_id
        piece = vocab.table.piece_of(token_id)
        is_forced = row.forced_token_id is not None
        is_reasoning = self.thinking.push(piece, is_forced=is_forced)
        if self.grammar is not None:
            self.grammar.advance(token_id)
        self._append(token_id)
        delta = self.stopper.feed(self.detokenizer.push(token_id))
        self.text += delta
        now = time.perf_counter()
        is_first = self.first_token_at is None
        if is_first:
            self.first_token_at = now
            self.ttft_ms = (now - self.arrived_at) * 1000
        top_raw = vocab.alternatives(sample.top_raw)
        return Step(
            index=len(self.generated_ids) - 1,
            phase="prefill" if is_first else "decode",
            token_id=token_id,
            piece=piece,
            token_bytes=vocab.table.bytes_of(token_id),
            text_delta=delta,
            logprob=sample.logprob,
            raw_logprob=sample.raw_logprob,
            rank=sample.rank,
            entropy=sample.entropy,
            latency_ms=latency_ms,
            top_raw=top_raw,
            # No processor (greedy, temperature 1, no filters) samples the raw distribution itself.
            top_processed=top_raw if sample.top_processed is None else vocab.alternatives(sample.top_processed),
            kv_cache_bytes=kv_bytes,
            is_reasoning=is_reasoning,
            is_forced=is_forced,
            moe_routing=routing,
            masked_prob=sample.masked_prob,
            top_masked=vocab.alternatives(sample.top_masked) if sample.top_masked else (),
        )

    def _append(self, token_id: int) -> None:
        self.generated_ids.append(token_id)
        self.seq.append_token(token_id)

    def finish_reason(self, step: Step, vocab: Vocabulary) -> str | None:
        if step.token_id in vocab.eos_token_ids and not self.params.ignore_eos:
            return "eos"
        if self.stopper.is_stopped:
            return "stop_string"
        if self.grammar is not None and self.grammar.is_finished:
            return "grammar"  # complete, and nothing but the end of sequence could follow
        if len(self.generated_ids) >= self.params.max_new_tokens:
            return "length"
        if self.seq.num_tokens >= vocab.max_context:
            return "context"
        return None

    def with_tail(self, step: Step) -> Step:
        """Releases text held back (a possible stop-string start, an unfinished UTF-8 char) on the last step."""
        tail = self.release_tail()
        return replace(step, text_delta=step.text_delta + tail) if tail else step

    def release_tail(self) -> str:
        """The text held back so far, now added to the request's text (none once a stop string matched)."""
        tail = "" if self.stopper.is_stopped else self.stopper.feed(self.detokenizer.flush()) + self.stopper.flush()
        self.text += tail
        return tail

    # ---- in the batch (`inference.batch_request.BatchRequest`) ------------------------------

    @property
    def seqs(self) -> list[Sequence]:
        return [self.seq]

    def sampling_rows(self) -> list[tuple[Request, Row]]:
        """This step's rows: its own, then its forks' (they sample their first token from the
        leader's logits row; the leader forks them once its own token is taken)."""
        return [(self, self.row()), *((fork, fork.row()) for fork in self.forks)]

    def take_logits(self, seq: Sequence, logits: torch.Tensor) -> bool:
        return False  # its token comes from its sampled row

    def kv_bytes(self, bytes_per_token: int, block_size: int) -> int:
        """The KV it keeps: none without a KV cache (each step's is thrown away)."""
        return self.seq.num_computed_tokens * bytes_per_token if self.params.use_kv_cache else 0

    def end(self, reason: str, vocab: Vocabulary, kv_bytes: int, error: str | None = None) -> Finished:
        """Ends it before its own end: `cancelled` (the text held back is released: no step
        carries it, the `Finished` text does) or `error`."""
        if reason == "cancelled":
            self.release_tail()
        return self.finish(reason, kv_bytes, error)

    # ---- the end ---------------------------------------------------------------------------

    def finish(self, reason: str, kv_bytes: int, error: str | None = None) -> Finished:
        prefilled = self.prefilled or Prefilled(len(self.prompt_ids), 0, 0, 0.0, 0)
        num_decoded = max(len(self.generated_ids) - 1, 0)
        # The stream's own rate: wall time from its first token to its last, whoever shared the steps.
        decode_ms = (time.perf_counter() - self.first_token_at) * 1000 if self.first_token_at else 0.0
        return Finished(
            finish_reason=reason,
            text=self.text,
            token_ids=tuple(self.generated_ids),
            num_prompt_tokens=len(self.prompt_ids),
            num_cached_tokens=prefilled.num_cached_tokens,
            num_generated_tokens=len(self.generated_ids),
            prefill_ms=prefilled.prefill_ms,
            ttft_ms=self.ttft_ms,
            decode_ms=decode_ms,
            decode_tok_s=num_decoded / (decode_ms / 1000) if num_decoded and decode_ms else 0.0,
            kv_cache_bytes=kv_bytes,
            queue_ms=prefilled.queue_ms,
            seed=self.sampler.seed,
            num_reasoning_tokens=self.thinking.num_reasoning_tokens,
            thinking_ended_by_budget=self.thinking.ended_by_budget,
            error=error,
        )

    def handoff_of(self, layers: LayerKV, first_step: Step) -> Handoff:
        """Everything a decode worker needs to go on after the first token."""
        return Handoff(
            prompt_ids=self.prompt_ids,
            params=self.params,
            layers=layers,
            prefilled=self.prefilled,
            first_step=first_step,
            rng_state=self.sampler.generator.get_state(),
            seed=self.sampler.seed,
            ttft_ms=self.ttft_ms,
            image_spans=self.image_spans,
        )

    def resume(self, handoff: Handoff, vocab: Vocabulary) -> None:
        """Takes up the state the prefill worker left after the first token (its KV is loaded
        into this request's blocks when it is admitted)."""
        self.sampler.generator.set_state(handoff.rng_state)
        self.prefilled = handoff.prefilled
        first = handoff.first_step
        if first.is_forced:
            self.thinking.forced_token()  # the prefill worker's budget forced it: take up the same state
        self.thinking.push(vocab.table.piece_of(first.token_id), is_forced=first.is_forced)
        if self.grammar is not None:
            self.grammar.advance(first.token_id)
        self._append(first.token_id)
        self.text = self.stopper.feed(self.detokenizer.push(first.token_id))
        self.ttft_ms = handoff.ttft_ms
        self.first_token_at = time.perf_counter()
        self.handoff = handoff
