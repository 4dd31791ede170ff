"""A beam-search request in the batch: its beams are sequences that share KV blocks.

Owns: the beams' sequences (one scheduler group: preempted and admitted together), collecting
each beam's logits row as the batch computes it, advancing the search (`BeamSearchState`, the
semantics of transformers' beam search) once every beam has its row, and re-forking the beams
from their parents: a new beam shares its parent's blocks and copies only the partly filled
last one when it writes (copy-on-write, `BlockManager.fork`). Records: `Prefilled`, a
`BeamStep` per step, one `Finished` with the returned sequences.
Must not know: models, the KV pool's tensors, Django.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from inference.core.scheduler import Scheduler
from inference.core.sequence import Sequence
from inference.events import BeamStep, Event, Finished, Prefilled
from inference.requests import Request, Vocabulary
from inference.sampling.beam import BeamSearchState, StepResult
from inference.sampling.sampler import Row
from inference.sampling_params import SamplingParams
from inference.text.tokenization import text_deltas
from inference.vision.images import PromptImage
from inference.vision.spans import ImageSpan


@dataclass
class BeamRequest:
    request_id: int
    prompt_ids: list[int]
    params: SamplingParams
    state: BeamSearchState
    members: list[Sequence]  # the running beams, in the search's order (one group)
    arrived_at: float = field(default_factory=time.perf_counter)
    prefilled: Prefilled | None = None
    prefill_started_at: float | None = None
    prefill_done_at: float = 0.0
    first_step_at: float = 0.0
    last_step_at: float = 0.0
    num_steps: int = 0
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # seq_id -> its logits row of this step
    is_cancelled: bool = False
    images: tuple[PromptImage, ...] = ()  # a beam search takes text prompts only
    image_spans: tuple[ImageSpan, ...] = ()
    forks: list[Request] = field(default_factory=list)  # none: parallel choices are sampled requests'

    @classmethod
    def new(
        cls, request_id: int, prompt_ids: list[int], params: SamplingParams, vocab: Vocabulary, device: torch.device
    ) -> BeamRequest:
        limit = min(vocab.max_context, len(prompt_ids) + params.max_new_tokens)
        eos = () if params.ignore_eos else vocab.eos_token_ids
        decode = lambda ids: vocab.tokenizer.decode(ids, skip_special_tokens=True)
        state = BeamSearchState(prompt_ids, params, eos, limit, decode, device)
        leader = Sequence(list(prompt_ids), params, num_slots=params.num_beams)
        leader.group = [leader]
        return cls(request_id, list(prompt_ids), params, state, leader.group)

    @property
    def seq(self) -> Sequence:
        return self.members[0]

    # ---- in the batch (`inference.batch_request.BatchRequest`) ------------------------------

    @property
    def seqs(self) -> list[Sequence]:
        return self.members

    def sampling_rows(self) -> list[tuple[Request, Row]]:
        return []  # the search reads the raw logits rows (`take_logits`)

    def take_logits(self, seq: Sequence, logits: torch.Tensor) -> bool:
        """Keeps `seq`'s row; True when every beam has one (the search can advance)."""
        self.rows[seq.seq_id] = logits
        return all(m.seq_id in self.rows for m in self.members)

    def kv_bytes(self, bytes_per_token: int, block_size: int) -> int:
        """The distinct blocks the beams hold (they share their common prefix)."""
        if not self.params.use_kv_cache:
            return 0
        return len({block for seq in self.members for block in seq.block_table}) * block_size * bytes_per_token

    def end(self, reason: str, vocab: Vocabulary, kv_bytes: int, error: str | None = None) -> Finished:
        """Ends it before its own end (`cancelled` or `error`): the best sequences so far."""
        return replace(self.finished(vocab, kv_bytes), finish_reason=reason, error=error)

    def advance(self, scheduler: Scheduler, kv_bytes: int) -> tuple[list[Event], bool]:
        """One search step over the collected rows: its records, and whether the search ended.
        Live beams are re-forked from their parents (the old sequences let go of their blocks)."""
        now = time.perf_counter()
        events: list[Event] = []
        if self.prefilled is None:
            self.prefill_done_at = now
            self.prefilled = Prefilled(
                num_prompt_tokens=len(self.prompt_ids),
                num_cached_tokens=self.seq.num_cached_tokens,
                num_prefilled_tokens=len(self.prompt_ids) - self.seq.num_cached_tokens,
                prefill_ms=(now - (self.prefill_started_at or now)) * 1000,
                kv_cache_bytes=kv_bytes,
                queue_ms=((self.seq.first_scheduled_at or now) - self.arrived_at) * 1000,
            )
            events.append(self.prefilled)
        rows = [self.rows[m.seq_id] for m in self.members]
        logits = torch.stack(rows) if len(rows) > 1 else rows[0].expand(self.params.num_beams, -1)  # (beams, V)
        self.rows.clear()
        result = self.state.advance(logits)
        events.append(
            BeamStep(
                index=self.num_steps,
                phase="decode" if self.num_steps else "prefill",
                beams=result.beams,
                latency_ms=(now - (self.last_step_at or self.prefill_started_at or now)) * 1000,
            )
        )
        self.first_step_at = self.first_step_at or now
        self.last_step_at = now
        self.num_steps += 1
        if result.is_done:
            return events, True
        self._refork(scheduler, result)
        return events, False

    def _refork(self, scheduler: Scheduler, result: StepResult) -> None:
        old = list(self.members)
        group: list[Sequence] = []
        for parent_row, tokens in zip(result.beam_ids.tolist(), self.state.running_tokens):
            parent = old[parent_row] if len(old) > 1 else old[0]
            child = Sequence(list(parent.token_ids), self.params, num_prompt_tokens=len(self.prompt_ids), group=group)
            scheduler.fork(parent, child)
            child.append_token(tokens[-1])
            if not self.params.use_kv_cache:
                scheduler.recompute(child)  # no KV cache: every step recomputes the whole beam
            group.append(child)
        for seq in old:
            scheduler.finish(seq)
        self.members[:] = group  # the same list object: it is the group every member points to

    def finished(self, vocab: Vocabulary, kv_bytes: int) -> Finished:
        is_cancelled = self.is_cancelled
        sequences = self.state.best(include_running=is_cancelled)
        best = sequences[0] if sequences else None
        end = time.perf_counter()
        decode_s = end - self.prefill_done_at if self.prefill_done_at else 0.0
        num_decode_steps = max(self.num_steps - 1, 0)  # every step after the first extends all beams by a token
        prefilled = self.prefilled or Prefilled(len(self.prompt_ids), 0, 0, 0.0, 0)
        sequences = tuple(
            replace(beam, text_deltas=text_deltas(vocab.tokenizer, beam.token_ids, beam.text)) for beam in sequences
        )
        return Finished(
            finish_reason="cancelled" if is_cancelled else self.state.finish_reason(best, vocab.max_context),
            text=best.text if best else "",
            token_ids=best.token_ids if best else (),
            num_prompt_tokens=len(self.prompt_ids),
            num_cached_tokens=prefilled.num_cached_tokens,
            num_generated_tokens=len(best.token_ids) if best else 0,
            prefill_ms=prefilled.prefill_ms,
            ttft_ms=((self.first_step_at or end) - self.arrived_at) * 1000,
            decode_ms=decode_s * 1000,
            decode_tok_s=num_decode_steps / decode_s if decode_s > 0 and num_decode_steps else 0.0,
            kv_cache_bytes=kv_bytes,
            queue_ms=prefilled.queue_ms,
            sequences=sequences,
        )
