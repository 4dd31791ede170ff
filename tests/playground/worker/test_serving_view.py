"""The serving view and /metrics: what a worker's engine loop reports about its batch reaches
the serving page's socket, and every live worker's numbers reach /metrics."""

from __future__ import annotations

import json
import time

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from inference import SamplingParams
from inference.introspect.device_limits import device_limits
from playground.asgi import application
from playground.coord import keys, liveness, store
from playground.worker.metrics import WorkerMetrics
from playground.worker.observer import WorkerObserver
from playground.worker.serve_loop import ServeLoop
from tests.inference.engines import engine_for

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

TIMEOUT_S = 10
HEADERS = [(b"host", b"localhost"), (b"origin", b"http://localhost")]


def serve_two_requests(worker: str) -> WorkerObserver:
    observer = WorkerObserver()
    observer.worker = observer.metrics.worker = worker
    loop = ServeLoop(engine_for("llama"), lambda ids: set(), observer)
    params = SamplingParams(greedy=True, max_new_tokens=5, ignore_eos=True)
    first, second = loop.submit([5, 6, 7, 8], params, 1), loop.submit([9, 10, 11], params, 2)
    list(first), list(second)
    return observer


async def test_the_serving_socket_shows_the_steps_the_worker_ran() -> None:
    beat = liveness.start_worker_heartbeat("w0@test")  # alive, idle: it runs no steps
    ws = WebsocketCommunicator(application, "/ws/serving/", headers=HEADERS)
    connected, _ = await ws.connect(timeout=TIMEOUT_S)
    assert connected
    # An idle worker sends nothing: the page learns who is up when it connects.
    assert await ws.receive_json_from(timeout=TIMEOUT_S) == {"type": "serving.workers", "workers": ["w0@test"]}
    await sync_to_async(beat.stop)()
    await sync_to_async(serve_two_requests)("w1@test")
    message = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert message["type"] == "serving.step" and message["worker"] == "w1@test"
    step = message["step"]
    assert {c["generation_id"] for c in step["chunks"]} <= {1, 2} and step["chunks"]
    assert step["chunks"][0]["kind"] == "prefill" and step["blocks"]["num_blocks"] > 0
    await ws.send_json_to({"command": "generate"})
    refused = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert refused["type"] == "error" and refused["code"] == "unknown_command"
    await ws.disconnect()


def test_metrics_show_every_live_workers_numbers_in_prometheus_format() -> None:
    observer = serve_two_requests("w2@test")
    # The loop writes its last snapshot right after delivering the last event: wait for it.
    deadline = time.monotonic() + 5
    while (snapshot := json.loads(store.client().get(keys.worker_metrics("w2@test")) or "{}")).get("counters", {}).get(
        "requests_finished_total"
    ) != 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert snapshot["counters"]["generated_tokens_total"] == 10
    text = Client().get("/metrics").content.decode()
    assert 'playground_generated_tokens_total{model="tiny-llama",worker="w2@test"} 10.0' in text
    assert 'playground_requests_finished_total{model="tiny-llama",worker="w2@test"} 2.0' in text
    assert 'playground_finish_reasons_total{model="tiny-llama",reason="length",worker="w2@test"} 2.0' in text
    assert 'playground_time_to_first_token_seconds_count{model="tiny-llama",worker="w2@test"} 2.0' in text
    assert 'playground_inter_token_latency_seconds_count{model="tiny-llama",worker="w2@test"} 8.0' in text
    assert "playground_kv_blocks_used{" in text and "playground_generations_queued 0.0" in text
    assert observer.metrics.histograms["queue_time_seconds"].counts[0] >= 1


def test_metrics_answer_without_any_worker() -> None:
    store.client().flushdb()
    response = Client().get("/metrics")
    assert response.status_code == 200 and "playground_generations_queued 0.0" in response.content.decode()


def test_metrics_report_the_device_limits_once_measured() -> None:
    engine = engine_for("llama")
    limits = device_limits(engine.device, engine.loaded.dtype)  # what the first roofline view does
    gauges = WorkerMetrics("w3@test").snapshot(engine, 0)["gauges"]
    assert gauges["device_matmul_flops_per_second"] == limits.matmul_flops_per_s > 0
    assert gauges["device_memory_bytes_per_second"] == limits.memory_bytes_per_s > 0
