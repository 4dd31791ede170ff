"""`/metrics` in Prometheus' text format: every live worker's numbers, labelled by worker.

Owns: turning the workers' snapshots (written by `playground.worker.metrics` to Redis, each
with a TTL, so a dead worker drops out) into metric families with the ecosystem's client
library, plus what only the web side knows (generations queued for a worker). Must not know:
torch, the engine.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from playground.coord import keys, store
from playground.models import Generation

logger = logging.getLogger(__name__)

PREFIX = "playground_"
HELP = {
    "requests_running": "Generations in the worker's batch (prefilling or decoding)",
    "requests_waiting": "Generations waiting for a place in the worker's batch",
    "kv_blocks_total": "KV blocks in the worker's paged pool",
    "kv_blocks_used": "KV blocks held by running generations",
    "kv_blocks_cached": "Full KV blocks kept by prefix hash (shareable)",
    "kv_block_size_tokens": "Tokens per KV block",
    "generated_tokens_total": "Tokens generated",
    "prompt_tokens_total": "Prompt tokens received",
    "requests_finished_total": "Generations finished (any reason)",
    "steps_total": "Engine steps (one batched forward pass each)",
    "prefix_cache_hit_tokens_total": "Prompt tokens reused from the prefix cache",
    "prefix_cache_queried_tokens_total": "Prompt tokens looked up in the prefix cache",
    "preemptions_total": "Generations preempted for lack of KV blocks (recomputed later)",
    "time_to_first_token_seconds": "Arrival at the worker to first token",
    "inter_token_latency_seconds": "Time between two tokens of one generation",
    "queue_time_seconds": "Arrival at the worker to first scheduled step",
    "device_matmul_flops_per_second": "Matmul FLOP/s the worker measured on its device (model dtype)",
    "device_memory_bytes_per_second": "Memory read bandwidth the worker measured on its device",
}


class WorkersCollector:
    def collect(self) -> Iterator[Metric]:
        snapshots = _snapshots()
        yield from _gauges(snapshots)
        yield from _counters(snapshots)
        yield from _histograms(snapshots)
        queued = GaugeMetricFamily(PREFIX + "generations_queued", "Generations queued, not yet taken by a worker")
        queued.add_metric([], Generation.objects.filter(status=Generation.Status.QUEUED).count())
        yield queued


def _snapshots() -> list[dict]:
    try:
        r = store.client()
        names = sorted(r.scan_iter(match=keys.WORKER_METRICS_PATTERN, count=100))
        return [json.loads(raw) for raw in r.mget(names) if raw] if names else []
    except Exception:  # Redis down: report what the web side knows
        logger.warning("could not read the workers' metrics", exc_info=True)
        return []


def _gauges(snapshots: list[dict]) -> Iterator[Metric]:
    for name in sorted({n for s in snapshots for n in s["gauges"]}):
        family = GaugeMetricFamily(PREFIX + name, HELP.get(name, name), labels=["worker", "model"])
        for s in snapshots:
            if name in s["gauges"]:
                family.add_metric([s["worker"], s["model"]], s["gauges"][name])
        yield family


def _counters(snapshots: list[dict]) -> Iterator[Metric]:
    for name in sorted({n for s in snapshots for n in s["counters"]}):
        family = CounterMetricFamily(
            PREFIX + name.removesuffix("_total"), HELP.get(name, name), labels=["worker", "model"]
        )
        for s in snapshots:
            if name in s["counters"]:
                family.add_metric([s["worker"], s["model"]], s["counters"][name])
        yield family
    reasons = CounterMetricFamily(
        PREFIX + "finish_reasons", "Generations finished, by reason", labels=["worker", "model", "reason"]
    )
    for s in snapshots:
        for reason, count in s.get("finish_reasons", {}).items():
            reasons.add_metric([s["worker"], s["model"], reason], count)
    yield reasons


def _histograms(snapshots: list[dict]) -> Iterator[Metric]:
    for name in sorted({n for s in snapshots for n in s["histograms"]}):
        family = HistogramMetricFamily(PREFIX + name, HELP.get(name, name), labels=["worker", "model"])
        for s in snapshots:
            h = s["histograms"].get(name)
            if h is None:
                continue
            cumulative, buckets = 0, []
            for bound, count in zip([*map(str, h["buckets"]), "+Inf"], h["counts"]):
                cumulative += count
                buckets.append((bound, cumulative))
            family.add_metric([s["worker"], s["model"]], buckets, sum_value=h["sum"])
        yield family


def metrics(request: HttpRequest) -> HttpResponse:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkersCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
