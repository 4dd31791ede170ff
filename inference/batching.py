"""Continuous batching: every running request shares each forward pass.

Owns: the step loop of the batched path (schedule -> one forward pass -> sample per request ->
events), the paged KV pool and its block manager (which is also the prefix cache: blocks
shared by hash), per-request cancellation, and the record of each step for the live view
(`BatchStep`). Per-request sampling, stop conditions and step records are the engine's
(`Engine._sample_step` and friends), so a request gets the same `Step`s here as alone.
Must not know: Django, Celery, sockets.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from inference.config import EngineConfig
from inference.core.block_manager import BlockManager
from inference.core.scheduler import Scheduler, SchedulerOutput
from inference.core.sequence import Sequence
from inference.events import Event, Prefilled, Step
from inference.kv.paged import PagedKVPool, kv_bytes_per_token, num_blocks_for
from inference.kv.transfer import HandedOff, Handoff
from inference.models.batched_llama import BatchedLlamaRunner
from inference.models.llama import LlamaRunner
from inference.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inference.engine import Engine, _Run


@dataclass(frozen=True)
class BatchStep:
    """What one step of the batch did: who shared it, how, and the KV pool after it."""

    index: int
    step_ms: float
    num_batched_tokens: int
    max_num_batched_tokens: int
    chunks: tuple[dict[str, Any], ...]  # {request_id, kind: prefill|decode, start, num_tokens, samples}
    num_running: int
    num_waiting: int
    preempted_ids: tuple[int, ...]
    num_preemptions: int  # since the engine started
    blocks: dict[str, int | float]  # BlockManager.stats()
    type: str = "batch_step"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Request:
    run: _Run
    seq: Sequence
    is_cancelled: bool = False
    prefill_started_at: float | None = None
    handoff: Handoff | None = None  # a handed-over request: its KV waits to be loaded into its blocks
    prefill_only: bool = False  # ends after its first token, exported for a decode worker


class ContinuousBatcher:
    def __init__(self, engine: Engine, lean: LlamaRunner, config: EngineConfig) -> None:
        self.engine = engine
        per_token = kv_bytes_per_token(len(lean.layers), lean.num_kv_heads, lean.head_dim, lean.dtype)
        num_blocks = num_blocks_for(config.kv_cache_bytes, config.block_size, per_token)
        self.pool = PagedKVPool(
            len(lean.layers), num_blocks, config.block_size, lean.num_kv_heads, lean.head_dim, lean.dtype, lean.device
        )
        self.runner = BatchedLlamaRunner(lean, self.pool)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.requests: dict[int, _Request] = {}
        self.num_steps = 0
        self.last_step: BatchStep | None = None

    @staticmethod
    def accepts(params: SamplingParams) -> bool:
        """Beam search keeps several caches and the no-KV-cache mode none: those run alone."""
        return params.use_kv_cache and not params.is_beam_search

    def add(self, request_id: int, prompt_ids: list[int], params: SamplingParams, prefill_only: bool = False) -> None:
        run = self.engine._new_run(prompt_ids, params, with_cache=False)
        seq = Sequence(list(prompt_ids), params, seq_id=request_id)
        run.seq = seq
        self.scheduler.add(seq)  # refuses a prompt that could never fit the pool
        self.requests[request_id] = _Request(run, seq, prefill_only=prefill_only)

    def add_handoff(self, request_id: int, handoff: Handoff) -> None:
        """A request another worker prefilled: it joins the batch with its first token, and its
        prompt's KV is loaded into its own blocks when it is admitted (none is recomputed)."""
        run = self.engine._resume(handoff, with_cache=False)
        prompt_ids = list(handoff.prompt_ids)
        seq = Sequence(
            [*prompt_ids, handoff.first_step.token_id],
            handoff.params,
            num_prompt_tokens=len(prompt_ids),
            seq_id=request_id,
            num_imported_tokens=len(prompt_ids),
        )
        run.seq = seq
        self.scheduler.add(seq)
        self.requests[request_id] = _Request(run, seq, handoff=handoff)

    def cancel(self, request_id: int) -> bool:
        request = self.requests.get(request_id)
        if request is not None:
            request.is_cancelled = True
        return request is not None

    @property
    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def abort_all(self) -> None:
        for request in list(self.requests.values()):
            self._forget(request.seq)

    def prefix_cache_stats(self) -> dict[str, Any]:
        """The block-based prefix cache in the shape of the radix cache's stats (`kind` tells them apart)."""
        bm = self.block_manager
        num_hashed = len(bm.hash_to_block)
        num_lookups = bm.num_hits + bm.num_misses
        return {
            "kind": "blocks",
            "hits": bm.num_hits,
            "misses": bm.num_misses,
            "hit_rate": bm.num_hits / num_lookups if num_lookups else 0.0,
            "num_entries": num_hashed,
            "num_stored_tokens": num_hashed * bm.block_size,
            "num_bytes": num_hashed * bm.block_size * self.pool.bytes_per_token,
            "max_bytes": self.pool.nbytes,
            "num_evictions": bm.num_evictions,
            "num_cached_tokens": bm.num_hit_tokens,
        }

    def kv_bytes(self, seq: Sequence) -> int:
        return seq.num_computed_tokens * self.pool.bytes_per_token

    def step(self) -> list[tuple[int, Event]]:
        """One scheduler step: cancellations, then one forward pass for every scheduled chunk."""
        events = self._cancelled_events()
        out = self.scheduler.schedule()
        for seq in out.imported:
            events += self._import(self.requests[seq.seq_id])
        out.chunks = [c for c in out.chunks if c.seq.seq_id in self.requests]  # a handoff may end at once
        if out.is_empty:
            return events
        started = time.perf_counter()
        step_input = self.runner.prepare(out.chunks)
        logits = self.runner.forward(step_input)  # (S, vocab)
        forward_ms = (time.perf_counter() - started) * 1000
        self.scheduler.update(out)
        rows = iter(logits)
        for chunk in out.chunks:
            request = self.requests[chunk.seq.seq_id]
            request.prefill_started_at = request.prefill_started_at or started
            if chunk.is_last:
                events += [(chunk.seq.seq_id, e) for e in self._sample(request, next(rows), forward_ms)]
        self._record(out, started)
        return events

    def _sample(self, request: _Request, logits: torch.Tensor, forward_ms: float) -> list[Event]:
        engine, run, seq = self.engine, request.run, request.seq
        events: list[Event] = []
        is_first = not run.generated_ids
        if is_first:
            run.prefilled = self._prefilled(request)
            events.append(run.prefilled)
        step = engine._sample_step(run, logits, "prefill" if is_first else "decode", forward_ms)
        seq.append_token(step.token_id)
        if request.prefill_only:
            return [*events, step, self._hand_off(request, step)]
        reason = engine._finish_reason(run, step, None)
        if reason is None:
            return [*events, step]
        events += [engine._with_tail(run, step), engine._finish(run, reason)]
        self._forget(seq)
        return events

    def _import(self, request: _Request) -> list[tuple[int, Event]]:
        """Loads a handoff's KV into the blocks it was just given; then, as `Engine.generate`
        does with a handoff, its Prefilled record and first token (which may already end it)."""
        run, seq, handoff = request.run, request.seq, request.handoff
        self.pool.load(seq.block_table, handoff.layers)
        self.block_manager.mark_computed(seq)  # its full blocks become shareable like any others
        request.handoff = None  # the KV is in the pool now: keep one copy
        step = handoff.first_step
        events: list[Event] = [run.prefilled, step]
        reason = self.engine._finish_reason(run, step, None)
        if reason is not None:
            events[-1:] = [self.engine._with_tail(run, step), self.engine._finish(run, reason)]
            self._forget(seq)
        return [(seq.seq_id, e) for e in events]

    def _hand_off(self, request: _Request, first_step: Step) -> HandedOff:
        """Exports the prompt's KV from its blocks for a decode worker, then lets the blocks go
        (their full ones keep their hashes: the conversation's next turn reuses them here)."""
        run, seq = request.run, request.seq
        handoff = Handoff(
            prompt_ids=run.prompt_ids,
            params=run.params,
            layers=self.pool.export(seq.block_table, seq.num_prompt_tokens),
            prefilled=run.prefilled,
            first_step=first_step,
            rng_state=run.sampler.generator.get_state(),
            seed=run.sampler.seed,
            ttft_ms=run.ttft_ms,
        )
        self._forget(seq)
        return HandedOff(handoff)

    def _prefilled(self, request: _Request) -> Prefilled:
        seq, now = request.seq, time.perf_counter()
        return Prefilled(
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            num_prefilled_tokens=seq.num_prompt_tokens - seq.num_cached_tokens,
            prefill_ms=(now - request.prefill_started_at) * 1000,
            kv_cache_bytes=self.kv_bytes(seq),
            queue_ms=((seq.first_scheduled_at or now) - seq.arrived_at) * 1000,
        )

    def _cancelled_events(self) -> list[tuple[int, Event]]:
        events: list[tuple[int, Event]] = []
        for request_id, request in list(self.requests.items()):
            if request.is_cancelled:
                run = request.run
                if run.prefilled is None:  # cancelled while waiting or prefilling: nothing was computed for it
                    run.prefilled = Prefilled(len(run.prompt_ids), 0, 0, 0.0, 0)
                self.engine._release_tail(run)  # no step carries it: the Finished text does
                events.append((request_id, self.engine._finish(run, "cancelled")))
                self._forget(request.seq)
        return events

    def _forget(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        self.requests.pop(seq.seq_id, None)

    def _record(self, out: SchedulerOutput, started: float) -> None:
        self.num_steps += 1
        self.last_step = BatchStep(
            index=self.num_steps,
            step_ms=(time.perf_counter() - started) * 1000,
            num_batched_tokens=out.num_batched_tokens,
            max_num_batched_tokens=self.scheduler.max_num_batched_tokens,
            chunks=tuple(
                {
                    "request_id": c.seq.seq_id,
                    "kind": c.kind,
                    "start": c.start,
                    "num_tokens": c.num_tokens,
                    "samples": c.is_last,
                }
                for c in out.chunks
            ),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            preempted_ids=tuple(s.seq_id for s in out.preempted),
            num_preemptions=self.scheduler.num_preemptions,
            blocks=self.block_manager.stats(),
        )
