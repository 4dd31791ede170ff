"""Continuous batching: every request shares each forward pass.

Owns: the step loop (cancellations -> schedule -> handed-over KV loaded -> forked blocks copied
-> one forward pass for every scheduled chunk -> one sampling call for every row -> each
request's records), the requests in flight by id, parallel sampling (a prompt prefilled once,
then forked), per-request failure (a request whose row cannot be sampled, or whose records
fail, ends alone with an error; the rest of the batch goes on). Every request takes this one
path: greedy, sampled, beam search, no-KV-cache, images, PD prefill and decode, every
architecture, through one contract (`inference.batch_request.BatchRequest`: a sampled request
and a beam search end alike). The record of each step for the live view and the stats are
`inference.core.batch_stats`'; the inspection passes `inference.introspect.passes`'.
Must not know: Django, Celery, sockets, a request's kind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import replace
from functools import partial

import torch

from inference.batch_request import BatchRequest
from inference.beams import BeamRequest
from inference.config import EngineConfig
from inference.core.batch_stats import BatchStep, batch_step
from inference.core.block_manager import BlockManager
from inference.core.pacer import StepPacer
from inference.core.scheduler import Chunk, Scheduler
from inference.core.sequence import Sequence
from inference.events import Event, Step
from inference.intake import Intake
from inference.introspect.passes import InspectionPasses
from inference.kv.transfer import HandedOff, Handoff
from inference.models.runner import ModelRunner, StepOutput
from inference.requests import Request, Vocabulary
from inference.sampling.sampler import Row, RowSample, sample_rows
from inference.sampling_params import SamplingParams
from inference.speculative.speculator import Speculator
from inference.speculative.verify import VerifyFailed
from inference.vision.encoder import VisionSpec
from inference.vision.images import PromptImage
from inference.vision.spans import ImageSpan

logger = logging.getLogger(__name__)

__all__ = ["BatchStep", "EngineCore"]

STUCK = (
    "the request cannot start on this worker: its sequences together need more KV blocks "
    "or batch places than there are (a preempted beam search recomputes each beam's copy)"
)


class EngineCore:
    """The batch's requests by id (`add`, `cancel`) and its step; what the last step did is `last_step`."""

    def __init__(self, runner: ModelRunner, vocab: Vocabulary, config: EngineConfig, vision: VisionSpec | None):
        self.runner, self.vocab, self.vision = runner, vocab, vision
        self.block_manager = BlockManager(runner.pool.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.pacer = StepPacer(config.max_step_ms, config.max_num_batched_tokens)
        self.passes = InspectionPasses(runner, self.block_manager, config.max_num_batched_tokens)
        self.speculator = Speculator(vocab.max_context)
        self.requests: dict[int, BatchRequest] = {}
        self.owners: dict[int, BatchRequest] = {}  # seq_id -> the request it computes for
        self.intake = Intake(runner.device)
        self.num_steps = 0
        self.last_step: BatchStep | None = None

    # ---- requests in --------------------------------------------------------------------------

    def add(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        images: Seq[PromptImage] = (),
        image_spans: Seq[ImageSpan] = (),
        prefill_only: bool = False,
        num_choices: int = 1,
        client: str = "",
    ) -> list[int]:
        """Queues a request (or `num_choices` of them sharing one prefill); their ids. `client`:
        who asked (the scheduler shares the prefill budget fairly between clients)."""
        if not prefill_only:  # (a prefill worker's request never decodes here: its decode worker speculates)
            self.speculator.check(params)
        request = self.intake.requests(
            self.vocab, prompt_ids, params, images, image_spans, prefill_only, num_choices, client
        )
        for fork in request.forks:
            self.requests[fork.request_id] = fork  # not scheduled: forked from the leader's blocks
        return [self._queue(request, speculates=not prefill_only), *(f.request_id for f in request.forks)]

    def add_handoff(self, handoff: Handoff, client: str = "") -> int:
        """A request another worker prefilled (`Intake.resumed`)."""
        self.speculator.check(handoff.params)
        return self._queue(self.intake.resumed(self.vocab, handoff, client))

    def _queue(self, request: BatchRequest, speculates: bool = True) -> int:
        seq = request.seqs[0]  # the one it starts with (a beam search forks its beams after the prefill)
        self.scheduler.add(seq)  # refuses a prompt that could never fit the pool
        self.requests[request.request_id] = request
        self.owners[seq.seq_id] = request
        for speculating in (request, *request.forks) if speculates else ():
            self.speculator.add(speculating, self.vocab.tokenizer)
        return request.request_id

    def cancel(self, request_id: int) -> bool:
        if (request := self.requests.get(request_id)) is not None:
            request.is_cancelled = True
        return request is not None

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def abort_all(self) -> None:
        for request in list(self.requests.values()):
            self._forget(request)

    def _pixel_values(self, chunks: list[Chunk]) -> torch.Tensor | None:
        """The pixels of the images whose tokens the chunks compute, in their order."""
        images = [image for c in chunks for image in _images_in(c, self.owners[c.seq.seq_id])]
        return self.vision.pixel_values(images, self.runner.pool.dtype, self.runner.device) if images else None

    def _kv_bytes(self, request: BatchRequest) -> int:
        return request.kv_bytes(self.runner.bytes_per_token, self.block_manager.block_size)

    # ---- the step -----------------------------------------------------------------------------

    def step(self) -> list[tuple[int, Event]]:
        """One scheduler step: cancellations, then one forward pass for every scheduled chunk."""
        events = self._cancelled()
        for seq in self.scheduler.stuck()[:1]:  # else it would wait for ever, and everyone behind it
            events += self._fail([self.owners[seq.seq_id]], _RequestFailed(STUCK))
        self.speculator.propose(self.scheduler.running, self.owners)
        out = self.scheduler.schedule(self.pacer.token_budget())
        for seq in out.imported:
            owner = self.owners[seq.seq_id]
            events += self._guarded(owner, partial(self._import, owner))
        out.chunks = [c for c in out.chunks if c.seq.seq_id in self.owners]  # a handoff may end at once
        if out.is_empty:
            return events
        started = time.perf_counter()
        try:
            self.runner.copy_blocks(self.block_manager.take_copies())
            output = self.runner.run(out.chunks, self._pixel_values(out.chunks))
        except Exception as exc:  # the pass is the step's: its requests fail, the waiting ones go on
            logger.exception("the forward pass failed; ending the requests of this step")
            stepped = {self.owners[c.seq.seq_id].request_id: self.owners[c.seq.seq_id] for c in out.chunks}
            return events + self._fail(list(stepped.values()), exc)
        forward_ms = (time.perf_counter() - started) * 1000
        self.speculator.observe_step(out, forward_ms)
        is_prefill = any(c.kind == "prefill" for c in out.chunks)
        self.pacer.observe(out.num_batched_tokens, forward_ms, is_prefill)
        self.scheduler.update(out)
        events += self._sample(out.chunks, output, started, forward_ms)
        self.num_steps += 1
        step_ms = (time.perf_counter() - started) * 1000
        self.last_step = batch_step(self.num_steps, step_ms, out, self.scheduler, self._request_id_of)
        return events

    def _sample(
        self, chunks: list[Chunk], output: StepOutput, started: float, forward_ms: float
    ) -> list[tuple[int, Event]]:
        """Every sampling row of the step in one call; then each request's records."""
        sampled: list[tuple[Request, Row, int]] = []  # (request, its row, logits row)
        stepped: list[tuple[BatchRequest, Sequence, int]] = []
        verified: list[tuple[Request, Chunk, int]] = []  # (request, its chunk, first logits row)
        index = 0
        for chunk in chunks:
            if chunk.is_last:
                request = self.owners[chunk.seq.seq_id]
                request.prefill_started_at = request.prefill_started_at or started
                if chunk.num_draft_tokens:
                    verified.append((request, chunk, index))
                else:
                    sampled += [(r, row, index) for r, row in request.sampling_rows()]
                    stepped.append((request, chunk.seq, index))
            index += len(chunk.logit_offsets())
        events: list[tuple[int, Event]] = []
        for request, chunk, index in verified:
            rows = slice(index, index + chunk.num_draft_tokens + 1)
            verify = partial(self._verify, request, chunk, output.logits[rows], output.routing[rows], started)
            events += self._guarded(request, verify)
        if sampled:
            samples = _sample_rows(output.logits, sampled)
            latency_ms = (time.perf_counter() - started) * 1000  # the step's pass and its sampling
            for (request, row, index), sample in zip(sampled, samples):
                if request.request_id in self.requests:
                    take = partial(self._take, request, row, sample, latency_ms, output.routing[index])
                    events += self._guarded(request, take)
        for request, seq, index in stepped:  # a beam search advances on its beams' raw rows
            if request.take_logits(seq, output.logits[index]):
                events += self._guarded(request, partial(self._advance_beams, request))
        return events

    def _take(self, request: Request, row: Row, sample: RowSample, latency_ms: float, routing) -> list[Event]:
        """One sampled row's records: Prefilled (first token), the Step, then maybe the end."""
        if sample.error is not None:
            raise _RequestFailed(sample.error)
        events: list[Event] = []
        seq = request.seq
        if request.first_token_at is None:
            request.prefilled = request.prefilled_record(self._kv_bytes(request))
            events.append(request.prefilled)
            for fork in request.forks:  # share the prompt's blocks before the leader's token lands
                self.scheduler.fork(seq, fork.seq)
                fork.seq.num_cached_tokens = seq.num_prompt_tokens  # its prompt ran once, in the leader
                self.owners[fork.seq.seq_id] = fork
                fork.prefill_started_at = request.prefill_started_at
            seq.num_slots, request.forks = 1, []
        step = request.take(row, sample, self.vocab, latency_ms, self._kv_bytes(request), routing)
        if request.prefill_only:
            handoff = request.handoff_of(self.runner.export(seq.block_table, len(request.prompt_ids)), step)
            self._forget(request)
            return [*events, step, HandedOff(handoff)]
        return self._end_or_go_on(request, step, events)

    def _verify(self, request: Request, chunk: Chunk, logits: torch.Tensor, routing, started: float) -> list[Event]:
        """A decode that verified proposed tokens: the tokens the model chose, then maybe the end."""
        latency_ms = (time.perf_counter() - started) * 1000
        kv_bytes = self._kv_bytes(request)
        steps = self.speculator.verify(
            request, chunk, logits, routing, self.vocab, latency_ms, kv_bytes, self.scheduler
        )
        return self._end_or_go_on(request, steps[-1], steps[:-1])

    def _end_or_go_on(self, request: Request, step: Step, events: list[Event]) -> list[Event]:
        """`events`, the step, and the request's end if the step ended it."""
        reason = request.finish_reason(step, self.vocab)
        if reason is None:
            if not request.params.use_kv_cache:  # (never a handoff's: PD hands over KV caches only)
                self.scheduler.recompute(request.seq)  # no KV cache: the next step computes every token again
            return [*events, step]
        finished = request.finish(reason, self._kv_bytes(request))
        finished = replace(finished, **self.speculator.summary(request.request_id, finished.decode_ms))
        self._forget(request)
        return [*events, request.with_tail(step), finished]

    def _advance_beams(self, request: BeamRequest) -> list[Event]:
        events, is_done = request.advance(self.scheduler, self._kv_bytes(request))
        for seq in request.seqs:  # the search re-forked them
            self.owners[seq.seq_id] = request
        if not is_done:
            return events
        finished = request.finished(self.vocab, self._kv_bytes(request))
        self._forget(request)
        return [*events, finished]

    def _import(self, request: Request) -> list[Event]:
        """Loads a handoff's KV into the blocks it was just given; then its Prefilled record and
        first token (which may already end it)."""
        seq, handoff = request.seq, request.handoff
        self.runner.load(seq.block_table, handoff.layers)
        self.block_manager.mark_computed(seq)  # its full blocks become shareable like any others
        request.handoff = None  # the KV is in the pool now: keep one copy
        return self._end_or_go_on(request, handoff.first_step, [request.prefilled])

    # ---- ends ---------------------------------------------------------------------------------

    def _cancelled(self) -> list[tuple[int, Event]]:
        events: list[tuple[int, Event]] = []
        for request in [r for r in self.requests.values() if r.is_cancelled and r.request_id in self.requests]:
            for ending in self._forget(request):
                events.append((ending.request_id, ending.end("cancelled", self.vocab, self._kv_bytes(ending))))
        return events

    def _guarded(self, request: BatchRequest, records: Callable[[], list[Event]]) -> list[tuple[int, Event]]:
        """`records()`, the request's records, tagged with its id; a failure ends that request alone."""
        try:
            return [(request.request_id, e) for e in records()]
        except Exception as exc:
            if not isinstance(exc, _REFUSALS):
                logger.exception("request %s failed", request.request_id)
            return self._fail([request], exc)

    def _fail(self, requests, exc: Exception) -> list[tuple[int, Event]]:
        message = str(exc) if isinstance(exc, _REFUSALS) else f"the engine failed: {type(exc).__name__}: {exc}"
        events = []
        for request in requests:
            if request.request_id not in self.requests:
                continue
            for ending in self._forget(request):
                events.append((ending.request_id, ending.end("error", self.vocab, 0, error=message)))
        return events

    def _forget(self, request: BatchRequest) -> list[BatchRequest]:
        """Lets go of the request's blocks and forgets it; what ends with it: itself, and the
        forks it had not started yet (they end with their leader)."""
        for seq in list(request.seqs):
            self.scheduler.finish(seq)
            self.owners.pop(seq.seq_id, None)
        self.requests.pop(request.request_id, None)
        self.speculator.forget(request.request_id)
        for fork in request.forks:
            self.requests.pop(fork.request_id, None)
            self.speculator.forget(fork.request_id)
        return [request, *request.forks]

    def _request_id_of(self, seq: Sequence) -> int:
        return self.owners[seq.seq_id].request_id if seq.seq_id in self.owners else seq.seq_id


class _RequestFailed(RuntimeError):
    """A request that cannot go on (its message is the user's)."""


_REFUSALS = (_RequestFailed, VerifyFailed)  # their messages are the user's


def _sample_rows(logits: torch.Tensor, sampled: list[tuple[Request, Row, int]]) -> list[RowSample]:
    """Every row in one call; each alone if that fails (one row's settings must not fail the batch)."""
    rows = [row for _, row, _ in sampled]
    indices = [i for _, _, i in sampled]
    # Each logits row sampled once, in order (no forks): the rows themselves, not a copy.
    is_whole = indices == list(range(len(logits)))
    try:
        return sample_rows(logits if is_whole else logits[torch.tensor(indices, device=logits.device)], rows)
    except Exception:
        logger.exception("sampling the step's rows together failed; sampling each alone")
        return [_sample_alone(logits[i], row) for _, row, i in sampled]


def _sample_alone(logits: torch.Tensor, row: Row) -> RowSample:
    try:
        return sample_rows(logits[None], [row])[0]
    except Exception as exc:
        return RowSample(-1, 0.0, 0.0, 0, 0.0, (), None, error=f"sampling failed: {type(exc).__name__}: {exc}")


def _images_in(chunk: Chunk, request: BatchRequest) -> list[PromptImage]:
    """The images whose first token the chunk computes."""
    spans = zip(request.images, request.image_spans)
    return [image for image, span in spans if chunk.start <= span.start < chunk.start + chunk.num_tokens]
