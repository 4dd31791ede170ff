"""A worker keeps nothing per generation once the generation's task has ended: under DEBUG
(`make run`'s default) Django logs every query's SQL on the thread's connection and empties
that log only when a web request starts, which never happens in a worker (issue 21, "Worker
memory" in docs/reliability.md)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from playground import tasks
from playground.web import submit
from playground.worker import generation
from tests.playground.fake_engine import FakeEngine

pytestmark = pytest.mark.django_db


def test_a_generation_task_leaves_no_logged_queries_on_its_thread(
    owner: str, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DEBUG = True
    engine = FakeEngine("a long answer " * 20)
    logged_during_the_task: list[int] = []
    run = generation.run_generation

    def run_on_the_fake_engine(generation_id: int, worker: str) -> None:
        run(generation_id, worker, load_engine=lambda model: engine, send=lambda event: None)
        logged_during_the_task.append(len(connection.queries_log))

    monkeypatch.setattr(generation, "run_generation", run_on_the_fake_engine)
    for turn in range(3):
        queued = submit.generate(owner, {"content": f"Question {turn}?"})
        connection.queries_log.clear()  # only the task's own
        tasks.run_generation.apply(args=(queued.generation_id,))  # Celery's tracer, with its task signals
        assert len(connection.queries_log) == 0, "the task's queries outlived it"
    assert min(logged_during_the_task) > 5  # the generation did log its queries (saves of its steps, ...)


def test_metrics_forget_a_request_that_was_handed_off() -> None:
    """A prefill-only request (PD) ends with `handed_off`, never `finished`: its last-token time
    must not stay behind in the worker's metrics."""
    from types import SimpleNamespace

    from playground.worker.metrics import WorkerMetrics

    metrics = WorkerMetrics("w@test")
    metrics.observe(7, SimpleNamespace(type="step"))
    assert 7 in metrics._last_token_at
    metrics.observe(7, SimpleNamespace(type="handed_off"))
    assert metrics._last_token_at == {}


def test_a_worker_process_logs_no_queries_even_under_debug(settings: Any) -> None:
    from celery.signals import worker_init

    assert tasks._no_query_log in worker_init._live_receivers(None)  # what a starting worker calls
    settings.DEBUG = True
    tasks._no_query_log()
    assert settings.DEBUG is False
