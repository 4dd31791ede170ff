"""Continuous batching: every request shares each forward pass.

Owns: the step loop (cancellations -> schedule -> handed-over KV loaded -> forked blocks copied
-> one forward pass for every scheduled chunk -> one sampling call for every row -> each
request's records), the requests in flight by id, parallel sampling (a prompt prefilled once,
then forked), per-request failure (a request whose row cannot be sampled, or whose records
fail, ends alone with an error; the rest of the batch goes on), and the record of each step
for the live view (`BatchStep`). Every request takes this one path: greedy, sampled, beam
search, no-KV-cache, images, PD prefill and decode, every architecture.
Must not know: Django, Celery, sockets.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

import torch

from inference.beams import BeamRequest
from inference.config import EngineConfig
from inference.core.block_manager import BlockManager
from inference.core.pacer import StepPacer
from inference.core.scheduler import Chunk, Scheduler, SchedulerOutput
from inference.core.sequence import Sequence
from inference.events import Event, Prefilled
from inference.introspect.passes import InspectionPasses
from inference.kv.transfer import HandedOff, Handoff
from inference.models.runner import ModelRunner, StepOutput
from inference.requests import Request, Vocabulary
from inference.sampling.sampler import Row, RowSample, sample_rows
from inference.sampling_params import MAX_SEED, SamplingParams
from inference.vision.encoder import VisionSpec
from inference.vision.images import PromptImage
from inference.vision.spans import ImageSpan

logger = logging.getLogger(__name__)

AnyRequest = Request | BeamRequest


@dataclass(frozen=True)
class BatchStep:
    """What one step of the batch did: who shared it, how, and the KV pool after it."""

    index: int
    step_ms: float
    num_batched_tokens: int
    max_num_batched_tokens: int
    token_budget: int  # this step's: the maximum, or fewer to keep the step near max_step_ms
    chunks: tuple[dict[str, Any], ...]  # {request_id, kind: prefill|decode, start, num_tokens, samples}
    num_running: int
    num_waiting: int
    preempted_ids: tuple[int, ...]
    num_preemptions: int  # since the engine started
    blocks: dict[str, int | float]  # BlockManager.stats()
    type: str = "batch_step"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class EngineCore:
    def __init__(self, runner: ModelRunner, vocab: Vocabulary, config: EngineConfig, vision: VisionSpec | None):
        self.runner, self.vocab, self.vision = runner, vocab, vision
        self.block_manager = BlockManager(runner.pool.num_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.pacer = StepPacer(config.max_step_ms, config.max_num_batched_tokens)
        self.passes = InspectionPasses(runner, self.block_manager, config.max_num_batched_tokens)
        self.requests: dict[int, AnyRequest] = {}
        self.owners: dict[int, AnyRequest] = {}  # seq_id -> the request it computes for
        self._ids = itertools.count()
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
        if prefill_only and num_choices > 1:
            raise ValueError("a prefill-only request has one choice")
        if params.is_beam_search:
            request = BeamRequest.new(next(self._ids), prompt_ids, params, self.vocab, self.runner.device)
            request.seq.client = client
            return [self._queue(request, request.seq)]
        seeds = _choice_seeds(params, num_choices)
        leader = self._new_request(prompt_ids, params, seeds[0], images, image_spans)
        leader.prefill_only = prefill_only
        leader.seq.num_slots = num_choices
        leader.forks = [self._new_request(prompt_ids, params, seed, images, image_spans) for seed in seeds[1:]]
        for request in (leader, *leader.forks):
            request.seq.client = client
        for fork in leader.forks:
            self.requests[fork.request_id] = fork  # not scheduled: forked from the leader's blocks
        return [self._queue(leader, leader.seq), *(f.request_id for f in leader.forks)]

    def add_handoff(self, handoff: Handoff, client: str = "") -> int:
        """A request another worker prefilled: it joins the batch with its first token, and its
        prompt's KV is loaded into its own blocks when it is admitted (none is recomputed)."""
        request = self._new_request(handoff.prompt_ids, handoff.params, handoff.seed, (), handoff.image_spans)
        request.resume(handoff, self.vocab)
        request.seq.num_imported_tokens = len(handoff.prompt_ids)
        request.seq.client = client
        return self._queue(request, request.seq)

    def _new_request(self, prompt_ids, params, seed, images, image_spans) -> Request:
        device = self.runner.device
        return Request.new(
            next(self._ids), prompt_ids, params, self.vocab, device, seed=seed, images=images, image_spans=image_spans
        )

    def _queue(self, request: AnyRequest, seq: Sequence) -> int:
        self.scheduler.add(seq)  # refuses a prompt that could never fit the pool
        self.requests[request.request_id] = request
        self.owners[seq.seq_id] = request
        return request.request_id

    def cancel(self, request_id: int) -> bool:
        request = self.requests.get(request_id)
        if request is not None:
            request.is_cancelled = True
        return request is not None

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def waiting_request_ids(self) -> list[int]:
        """Requests queued for room in the batch, next first."""
        ids = (self.owners[seq.seq_id].request_id for seq in self.scheduler.waiting if seq.seq_id in self.owners)
        return list(dict.fromkeys(ids))

    def abort_all(self) -> None:
        for request in list(self.requests.values()):
            self._forget(request)

    def kv_bytes(self, seq: Sequence) -> int:
        """The KV the sequence keeps: none without a KV cache (each step's is thrown away)."""
        return seq.num_computed_tokens * self.runner.bytes_per_token if seq.params.use_kv_cache else 0

    def stats(self) -> dict[str, Any]:
        """The batch and its KV pool now: for the live view and the metrics."""
        scheduler = self.scheduler
        return {
            "num_running": len(scheduler.running),
            "num_waiting": len(scheduler.waiting),
            "num_steps": self.num_steps,
            "num_preemptions": scheduler.num_preemptions,
            "blocks": self.block_manager.stats(),
            "prefix_cache": self.prefix_cache_stats(),
        }

    def prefix_cache_stats(self) -> dict[str, Any]:
        """The prefix cache: the KV blocks every request shares by hash."""
        bm = self.block_manager
        num_hashed, num_lookups = len(bm.hash_to_block), bm.num_hits + bm.num_misses
        bytes_per_block = bm.block_size * self.runner.bytes_per_token
        return {
            "kind": "blocks",
            "hits": bm.num_hits,
            "misses": bm.num_misses,
            "hit_rate": bm.num_hits / num_lookups if num_lookups else 0.0,
            "num_entries": num_hashed,
            "num_stored_tokens": num_hashed * bm.block_size,
            "num_bytes": num_hashed * bytes_per_block,
            "max_bytes": bm.num_blocks * bytes_per_block,
            "num_evictions": bm.num_evictions,
            "num_cached_tokens": bm.num_hit_tokens,
        }

    # ---- the step -----------------------------------------------------------------------------

    def step(self) -> list[tuple[int, Event]]:
        """One scheduler step: cancellations, then one forward pass for every scheduled chunk."""
        events = self._cancelled()
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
        is_prefill = any(c.kind == "prefill" for c in out.chunks)
        self.pacer.observe(out.num_batched_tokens, forward_ms, is_prefill)
        self.scheduler.update(out)
        events += self._sample(out.chunks, output, started, forward_ms)
        self._record(out, started)
        return events

    def _pixel_values(self, chunks: list[Chunk]) -> torch.Tensor | None:
        """The pixels of the images whose tokens the chunks compute, in their order."""
        images = []
        for chunk in chunks:
            request = self.owners[chunk.seq.seq_id]
            for image, span in zip(getattr(request, "images", ()), getattr(request, "image_spans", ())):
                if chunk.start <= span.start < chunk.start + chunk.num_tokens:
                    images.append(image)
        if not images:
            return None
        return self.vision.pixel_values(images, self.runner.pool.dtype, self.runner.device)

    def _sample(
        self, chunks: list[Chunk], output: StepOutput, started: float, forward_ms: float
    ) -> list[tuple[int, Event]]:
        """Every sampling row of the step in one call; then each request's records."""
        sampled: list[tuple[Request, Row, int]] = []  # (request, its row, logits row)
        beams: list[tuple[BeamRequest, Sequence, int]] = []
        for index, chunk in enumerate(c for c in chunks if c.is_last):
            request = self.owners[chunk.seq.seq_id]
            if isinstance(request, BeamRequest):
                beams.append((request, chunk.seq, index))
                continue
            request.prefill_started_at = request.prefill_started_at or started
            sampled.append((request, request.row(), index))
            # Forks sample their first token from the leader's row (after it, which forks them).
            sampled += [(fork, fork.row(), index) for fork in request.forks]
        events: list[tuple[int, Event]] = []
        if sampled:
            samples = self._sample_rows(output.logits, sampled)
            latency_ms = (time.perf_counter() - started) * 1000  # the step's pass and its sampling
            for (request, row, index), sample in zip(sampled, samples):
                if request.request_id in self.requests:
                    take = partial(self._take, request, row, sample, latency_ms, output.routing[index])
                    events += self._guarded(request, take)
        for request, seq, index in beams:
            request.prefill_started_at = request.prefill_started_at or started
            if request.take_row(seq, output.logits[index]):
                events += self._guarded(request, partial(self._advance_beams, request))
        return events

    def _sample_rows(self, logits: torch.Tensor, sampled: list[tuple[Request, Row, int]]) -> list[RowSample]:
        rows = [row for _, row, _ in sampled]
        indices = [i for _, _, i in sampled]
        # Each logits row sampled once, in order (no forks): the rows themselves, not a copy.
        is_whole = indices == list(range(len(logits)))
        try:
            return sample_rows(logits if is_whole else logits[torch.tensor(indices, device=logits.device)], rows)
        except Exception:  # one row's settings broke the batch call: sample each alone
            logger.exception("sampling the step's rows together failed; sampling each alone")
            return [self._sample_alone(logits[i], row) for _, row, i in sampled]

    @staticmethod
    def _sample_alone(logits: torch.Tensor, row: Row) -> RowSample:
        try:
            return sample_rows(logits[None], [row])[0]
        except Exception as exc:
            return RowSample(-1, 0.0, 0.0, 0, 0.0, (), None, error=f"sampling failed: {type(exc).__name__}: {exc}")

    def _take(self, request: Request, row: Row, sample: RowSample, latency_ms: float, routing) -> list[Event]:
        """One sampled row's records: Prefilled (first token), the Step, then maybe the end."""
        if sample.error is not None:
            raise _RequestFailed(sample.error)
        events: list[Event] = []
        seq = request.seq
        if request.first_token_at is None:
            request.prefilled = self._prefilled(request)
            events.append(request.prefilled)
            for fork in request.forks:  # share the prompt's blocks before the leader's token lands
                self.scheduler.fork(seq, fork.seq)
                fork.seq.num_cached_tokens = seq.num_prompt_tokens  # its prompt ran once, in the leader
                self.owners[fork.seq.seq_id] = fork
                fork.prefill_started_at = request.prefill_started_at
            seq.num_slots, request.forks = 1, []
        step = request.take(row, sample, self.vocab, latency_ms, self.kv_bytes(seq), routing)
        if request.prefill_only:
            handoff = request.handoff_of(self.runner.export(seq.block_table, len(request.prompt_ids)), step)
            self._forget(request)
            return [*events, step, HandedOff(handoff)]
        reason = request.finish_reason(step, self.vocab)
        if reason is None:
            if not request.params.use_kv_cache:
                self.scheduler.recompute(seq)  # no KV cache: the next step computes every token again
            return [*events, step]
        finished = request.finish(reason, self.kv_bytes(seq))
        self._forget(request)
        return [*events, request.with_tail(step), finished]

    def _prefilled(self, request: Request) -> Prefilled:
        seq, now = request.seq, time.perf_counter()
        return Prefilled(
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_prefilled_tokens=seq.num_prompt_tokens - seq.num_cached_tokens,
            prefill_ms=(now - (request.prefill_started_at or now)) * 1000,
            kv_cache_bytes=self.kv_bytes(seq),
            queue_ms=((seq.first_scheduled_at or now) - request.arrived_at) * 1000,
        )

    def _advance_beams(self, request: BeamRequest) -> list[Event]:
        events, is_done = request.advance(self.scheduler, self._beam_kv_bytes(request))
        for seq in request.members:
            self.owners[seq.seq_id] = request
        if not is_done:
            return events
        finished = request.finished(self.vocab, self._beam_kv_bytes(request))
        self._forget(request)
        return [*events, finished]

    def _beam_kv_bytes(self, request: BeamRequest) -> int:
        """The distinct blocks the beams hold (they share their common prefix)."""
        if not request.params.use_kv_cache:
            return 0
        blocks = {block for seq in request.members for block in seq.block_table}
        return len(blocks) * self.block_manager.block_size * self.runner.bytes_per_token

    def _import(self, request: Request) -> list[Event]:
        """Loads a handoff's KV into the blocks it was just given; then its Prefilled record and
        first token (which may already end it)."""
        seq, handoff = request.seq, request.handoff
        self.runner.load(seq.block_table, handoff.layers)
        self.block_manager.mark_computed(seq)  # its full blocks become shareable like any others
        request.handoff = None  # the KV is in the pool now: keep one copy
        step = handoff.first_step
        reason = request.finish_reason(step, self.vocab)
        if reason is None:
            return [request.prefilled, step]
        finished = request.finish(reason, self.kv_bytes(seq))
        self._forget(request)
        return [request.prefilled, request.with_tail(step), finished]

    # ---- ends ---------------------------------------------------------------------------------

    def _cancelled(self) -> list[tuple[int, Event]]:
        events: list[tuple[int, Event]] = []
        for request in [r for r in self.requests.values() if r.is_cancelled and r.request_id in self.requests]:
            for ending in self._forget(request):
                if isinstance(ending, BeamRequest):
                    finished = ending.finished(self.vocab, self._beam_kv_bytes(ending))
                else:
                    ending.release_tail()  # no step carries it: the Finished text does
                    finished = ending.finish("cancelled", self.kv_bytes(ending.seq))
                events.append((ending.request_id, finished))
        return events

    def _guarded(self, request: AnyRequest, records: Callable[[], list[Event]]) -> list[tuple[int, Event]]:
        """`records()`, the request's records, tagged with its id; a failure ends that request alone."""
        try:
            return [(request.request_id, e) for e in records()]
        except Exception as exc:
            if not isinstance(exc, _RequestFailed):
                logger.exception("request %s failed", request.request_id)
            return self._fail([request], exc)

    def _fail(self, requests, exc: Exception) -> list[tuple[int, Event]]:
        message = str(exc) if isinstance(exc, _RequestFailed) else f"the engine failed: {type(exc).__name__}: {exc}"
        events = []
        for request in requests:
            if request.request_id not in self.requests:
                continue
            for ending in self._forget(request):
                finished = (
                    ending.finished(self.vocab, 0) if isinstance(ending, BeamRequest) else ending.finish("error", 0)
                )
                events.append((ending.request_id, replace(finished, finish_reason="error", error=message)))
        return events

    def _forget(self, request: AnyRequest) -> list[AnyRequest]:
        """Lets go of the request's blocks and forgets it; what ends with it: itself, and the
        forks it had not started yet (they end with their leader)."""
        seqs = list(request.members) if isinstance(request, BeamRequest) else [request.seq]
        for seq in seqs:
            self.scheduler.finish(seq)
            self.owners.pop(seq.seq_id, None)
        self.requests.pop(request.request_id, None)
        forks = request.forks if isinstance(request, Request) else []
        for fork in forks:
            self.requests.pop(fork.request_id, None)
        return [request, *forks]

    def _record(self, out: SchedulerOutput, started: float) -> None:
        self.num_steps += 1
        self.last_step = BatchStep(
            index=self.num_steps,
            step_ms=(time.perf_counter() - started) * 1000,
            num_batched_tokens=out.num_batched_tokens,
            max_num_batched_tokens=self.scheduler.max_num_batched_tokens,
            token_budget=self.scheduler.step_budget,
            chunks=tuple(
                {
                    "request_id": self._request_id_of(c.seq),
                    "kind": c.kind,
                    "start": c.start,
                    "num_tokens": c.num_tokens,
                    "samples": c.is_last,
                }
                for c in out.chunks
            ),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            preempted_ids=tuple(self._request_id_of(s) for s in out.preempted),
            num_preemptions=self.scheduler.num_preemptions,
            blocks=self.block_manager.stats(),
        )

    def _request_id_of(self, seq: Sequence) -> int:
        owner = self.owners.get(seq.seq_id)
        return owner.request_id if owner is not None else seq.seq_id


class _RequestFailed(RuntimeError):
    """A request that cannot go on (its message is the user's)."""


def _choice_seeds(params: SamplingParams, num_choices: int) -> list[int | None]:
    """Each choice's seed: a seeded request's choices are seed, seed + 1, ... (so they differ and
    replay); an unseeded one's are drawn per choice."""
    if num_choices < 1:
        raise ValueError(f"num_choices={num_choices} must be >= 1")
    if params.seed is None:
        return [None] * num_choices
    return [(params.seed + i) % (MAX_SEED + 1) for i in range(num_choices)]
