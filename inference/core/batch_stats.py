"""What the live view and the metrics read of the continuous batch.

Owns: one step's record (`BatchStep`: who shared the step, how, the KV pool after it), the batch
and its pool now (`batch_stats`), and the prefix cache's counters (`prefix_cache_stats`: the
KV blocks every request shares by hash). Must not know: requests' kinds, models, Django.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from inference.core.block_manager import BlockManager
from inference.core.scheduler import Scheduler, SchedulerOutput
from inference.core.sequence import Sequence


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


def batch_step(
    index: int, step_ms: float, out: SchedulerOutput, scheduler: Scheduler, request_id_of: Callable[[Sequence], int]
) -> BatchStep:
    """The record of the step `out` scheduled (`request_id_of`: whose a sequence is)."""
    return BatchStep(
        index=index,
        step_ms=step_ms,
        num_batched_tokens=out.num_batched_tokens,
        max_num_batched_tokens=scheduler.max_num_batched_tokens,
        token_budget=scheduler.step_budget,
        chunks=tuple(
            {
                "request_id": request_id_of(c.seq),
                "kind": c.kind,
                "start": c.start,
                "num_tokens": c.num_tokens,
                "samples": c.is_last,
            }
            for c in out.chunks
        ),
        num_running=len(scheduler.running),
        num_waiting=len(scheduler.waiting),
        preempted_ids=tuple(request_id_of(s) for s in out.preempted),
        num_preemptions=scheduler.num_preemptions,
        blocks=scheduler.block_manager.stats(),
    )


def batch_stats(scheduler: Scheduler, num_steps: int, bytes_per_token: int) -> dict[str, Any]:
    """The batch and its KV pool now."""
    return {
        "num_running": len(scheduler.running),
        "num_waiting": len(scheduler.waiting),
        "num_steps": num_steps,
        "num_preemptions": scheduler.num_preemptions,
        "blocks": scheduler.block_manager.stats(),
        "prefix_cache": prefix_cache_stats(scheduler.block_manager, bytes_per_token),
    }


def prefix_cache_stats(bm: BlockManager, bytes_per_token: int) -> dict[str, Any]:
    """The prefix cache: full KV blocks kept by hash, shared by the requests with the same prefix."""
    num_stored_blocks, num_lookups = len(bm.hash_to_block), bm.num_hits + bm.num_misses
    bytes_per_block = bm.block_size * bytes_per_token
    return {
        "hits": bm.num_hits,
        "misses": bm.num_misses,
        "hit_rate": bm.num_hits / num_lookups if num_lookups else 0.0,
        "num_stored_blocks": num_stored_blocks,
        "num_stored_tokens": num_stored_blocks * bm.block_size,
        "num_bytes": num_stored_blocks * bytes_per_block,
        "max_bytes": bm.num_blocks * bytes_per_block,
        "num_evictions": bm.num_evictions,
        "num_cached_tokens": bm.num_hit_tokens,  # tokens a lookup found cached, in total
    }
