"""What a worker's engine loop measures for Prometheus: requests running and waiting, time to
first token, inter-token latency, queue time, tokens, KV blocks, prefix-cache hits, and the
device's measured matmul FLOP/s and memory bandwidth (inference/introspect/device_limits.py).

Owns: the counters and histogram buckets of one worker process, kept from the loop thread's
events, and their snapshot in Redis (`coord.keys.worker_metrics`, about once a second, with
a TTL so a dead worker's numbers vanish). The web process turns every worker's snapshot into
the `/metrics` page (`playground.web.metrics`). Must not know: sockets, the ORM.
"""

from __future__ import annotations

import bisect
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from inference.introspect.device_limits import measured_limits
from playground.coord import keys, store

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.events import Event

logger = logging.getLogger(__name__)

FLUSH_EVERY_S = 1.0
SNAPSHOT_TTL_S = 30
# Seconds; the last bucket is +Inf. Wide: a CPU decodes at tens of ms per token, a GPU at ms.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "queue_time_seconds")


class Histogram:
    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds

    def to_dict(self) -> dict[str, Any]:
        return {"buckets": list(BUCKETS), "counts": self.counts, "sum": self.total}


class WorkerMetrics:
    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.histograms = {name: Histogram() for name in HISTOGRAMS}
        self.counters: dict[str, float] = {
            "generated_tokens_total": 0,
            "prompt_tokens_total": 0,
            "requests_finished_total": 0,
            "steps_total": 0,
        }
        self.finish_reasons: dict[str, int] = {}
        self._last_token_at: dict[int, float] = {}
        self._flushed_at = 0.0

    def observe(self, request_id: int, event: Event) -> None:
        kind, now = getattr(event, "type", ""), time.perf_counter()
        if kind == "step":
            self.counters["generated_tokens_total"] += 1
            last = self._last_token_at.get(request_id)
            if last is not None:
                self.histograms["inter_token_latency_seconds"].observe(now - last)
            self._last_token_at[request_id] = now
        elif kind == "prefilled":
            self.counters["prompt_tokens_total"] += event.num_prompt_tokens
            self.histograms["queue_time_seconds"].observe(event.queue_ms / 1000)
        elif kind == "handed_off":  # a prefill-only request ends here: its decode is another worker's
            self._last_token_at.pop(request_id, None)
        elif kind == "finished":
            self._last_token_at.pop(request_id, None)
            self.counters["requests_finished_total"] += 1
            self.finish_reasons[event.finish_reason] = self.finish_reasons.get(event.finish_reason, 0) + 1
            if event.num_generated_tokens:
                self.histograms["time_to_first_token_seconds"].observe(event.ttft_ms / 1000)

    def snapshot(self, engine: Engine, num_requests: int) -> dict[str, Any]:
        stats = engine.stats()
        num_waiting = stats["num_waiting"]
        gauges = {
            "requests_running": num_requests - num_waiting,
            "requests_waiting": num_waiting,
        }
        limits = measured_limits(engine.device, engine.loaded.dtype)  # once a roofline view measured them
        if limits is not None:
            gauges.update(
                device_matmul_flops_per_second=limits.matmul_flops_per_s,
                device_memory_bytes_per_second=limits.memory_bytes_per_s,
            )
        blocks = stats["blocks"]
        gauges.update(
            kv_blocks_total=blocks["num_blocks"],
            kv_blocks_used=blocks["num_used_blocks"],
            kv_blocks_cached=stats["prefix_cache"]["num_stored_blocks"],
            kv_block_size_tokens=blocks["block_size"],
        )
        counters = dict(self.counters)
        counters.update(
            prefix_cache_hit_tokens_total=blocks["num_hit_tokens"],
            prefix_cache_queried_tokens_total=blocks["num_queried_tokens"],
            preemptions_total=stats["num_preemptions"],
            steps_total=stats["num_steps"],
        )
        return {
            "worker": self.worker,
            "model": engine.info.name,
            "gauges": gauges,
            "counters": counters,
            "finish_reasons": self.finish_reasons,
            "histograms": {name: h.to_dict() for name, h in self.histograms.items()},
        }

    def flush(self, engine: Engine, num_requests: int, force: bool = False) -> None:
        """Writes the snapshot to Redis at most once per FLUSH_EVERY_S (never raises)."""
        now = time.monotonic()
        if not force and now - self._flushed_at < FLUSH_EVERY_S:
            return
        self._flushed_at = now
        try:
            store.client().set(
                keys.worker_metrics(self.worker), json.dumps(self.snapshot(engine, num_requests)), ex=SNAPSHOT_TTL_S
            )
        except store.OUTAGE_ERRORS as exc:
            logger.warning("could not write the metrics snapshot: Redis is unreachable (%s)", exc)
        except Exception:
            logger.warning("could not write the metrics snapshot", exc_info=True)
