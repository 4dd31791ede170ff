"""The one rule that declares a generation lost, and the heartbeats it reads."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from playground.coord import beacon, cancel, keys, liveness, store, worker_routing
from playground.models import Generation
from tests.playground.conftest import make_generation

pytestmark = pytest.mark.django_db

LONG_AGO = timedelta(minutes=5)


def running_since(owner: str, age: timedelta) -> Generation:
    return make_generation(owner, status="running", started_at=timezone.now() - age)


def test_a_running_generation_without_heartbeat_is_lost(owner: str) -> None:
    generation = running_since(owner, LONG_AGO)
    Generation.objects.filter(pk=generation.pk).update(worker="gpu@host-1")
    generation.refresh_from_db()
    assert liveness.mark_lost_if_stale(generation)
    generation.refresh_from_db()
    assert (generation.status, generation.error_code) == ("error", "worker_lost")
    assert "gpu@host-1" in generation.error_message  # which worker, and that its process is gone
    # Its client is answered now: a worker that still runs it stops at its next step.
    assert cancel.is_cancel_requested(generation.pk)
    assert not liveness.mark_lost_if_stale(running_since(owner, timedelta(0)))  # just started: give it time


def test_a_beating_generation_is_alive(owner: str) -> None:
    generation = running_since(owner, LONG_AGO)
    with liveness.generation_heartbeat(generation.pk):
        assert not liveness.mark_lost_if_stale(generation)
    assert liveness.mark_lost_if_stale(generation)  # the key went with the beat


def test_a_generation_that_finished_meanwhile_is_not_marked(owner: str) -> None:
    generation = running_since(owner, LONG_AGO)  # this copy still says "running"
    Generation.objects.filter(pk=generation.pk).update(status="finished")
    assert not liveness.mark_lost_if_stale(generation)
    generation.refresh_from_db()
    assert generation.status == "finished"


def queued_long_ago(owner: str) -> Generation:
    generation = make_generation(owner)
    Generation.objects.filter(pk=generation.pk).update(created_at=timezone.now() - LONG_AGO)
    generation.refresh_from_db()
    return generation


def test_a_queued_generation_is_lost_only_when_no_worker_lives(owner: str) -> None:
    generation = queued_long_ago(owner)
    worker_routing.record_sent(store.client(), generation.pk)  # as dispatch does
    generation.refresh_from_db()
    worker = liveness.start_worker_heartbeat("test-worker")
    try:
        assert not liveness.mark_lost_if_stale(generation)  # a busy worker will get to it: keep waiting
    finally:
        worker.stop()
    assert liveness.mark_lost_if_stale(generation)
    generation.refresh_from_db()
    assert "no worker" in generation.error_message


def test_a_queued_generation_whose_task_redis_lost_ends_as_service_unavailable(owner: str) -> None:
    """Redis restarted without its data: the task message is gone, the row would hold a slot."""
    worker = liveness.start_worker_heartbeat("test-worker")  # a healthy worker would never get it
    try:
        waiting, lost, claimed = queued_long_ago(owner), queued_long_ago(owner), queued_long_ago(owner)
        worker_routing.record_sent(store.client(), waiting.pk)
        worker_routing.claim_delivery(store.client(), claimed.pk, "test-worker")
        fresh = make_generation(owner)  # its task is being sent right now
        assert [liveness.mark_lost_if_stale(g) for g in (waiting, lost, claimed, fresh)] == [False, True, False, False]
    finally:
        worker.stop()
    lost.refresh_from_db()
    assert (lost.status, lost.error_code) == ("error", "service_unavailable")
    assert "Redis restarted" in lost.error_message


def test_redis_unreachable_declares_nothing_lost(owner: str, settings: Any) -> None:
    generation = running_since(owner, LONG_AGO)
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: cannot tell, so alive
    assert not liveness.mark_lost_if_stale(generation)
    assert not liveness.mark_lost_if_stale(queued_long_ago(owner))


def test_a_queued_generation_ends_at_an_outage_and_a_running_one_is_left_to_its_worker(owner: str) -> None:
    queued, running = make_generation(owner), running_since(owner, timedelta(0))
    event = liveness.end_queued_for_outage(queued.pk)
    assert (event["type"], event["code"]) == ("generation.error", "service_unavailable")
    assert "Redis" in event["message"] and "Error 111" not in event["message"]
    assert liveness.end_queued_for_outage(running.pk) is None
    Generation.objects.filter(pk=running.pk).update(status="finished", text="done")  # its worker ended it
    assert liveness.end_queued_for_outage(running.pk)["type"] == "generation.finished"


def test_a_worker_that_stops_cleanly_is_not_listed_alive_a_ttl_later(monkeypatch) -> None:
    """SIGTERM/Ctrl-C (Celery's worker_shutting_down): the serving page must not show it idle."""
    from playground import tasks
    from playground.worker import generation

    monkeypatch.setattr(generation, "stop_for_shutdown", lambda: None)  # no generation runs here
    liveness.start_worker_heartbeat("leaving@test")
    liveness.start_queue_heartbeat("leaving@test", ["gpu"])
    assert "leaving@test" in liveness.alive_workers() and liveness.queue_has_consumer("gpu")
    tasks._stop_generations()
    assert "leaving@test" not in liveness.alive_workers()
    assert not liveness.queue_has_consumer("gpu")


def test_a_request_no_worker_answered_says_why_as_the_workers_tell_it() -> None:
    """An inspection that timed out named "is a generation worker running?" while the worker was
    only loading a model (issue 46): the message now says what the workers say."""
    from playground.coord import model_states

    assert "no generation worker is running" in liveness.why_no_answer(120, "gpu")
    worker = liveness.start_worker_heartbeat("gpu@busy-host")
    try:
        assert "gpu@busy-host" in liveness.why_no_answer(120, "gpu")
        assert "busy" in liveness.why_no_answer(120, "gpu")
        model_states.keep("gpu@busy-host", model_states.record("loading", 3, "Qwen (bundled)", time.time() - 12))
        why = liveness.why_no_answer(120, "gpu")
        assert "gpu@busy-host is loading Qwen (bundled) (12 s so far)" in why
    finally:
        beacon.get().drop(keys.worker_model("gpu@busy-host"))
        worker.stop()


def test_a_dead_workers_rows_are_ended_without_anyone_reading_them(owner: str) -> None:
    """A row left `running` by a killed worker stayed so until a page or the API read it; every
    live worker now reaps them (`start_reaper`, every 30 s)."""
    stranded, fresh = running_since(owner, LONG_AGO), running_since(owner, timedelta(0))
    beating = running_since(owner, LONG_AGO)
    with liveness.generation_heartbeat(beating.pk):
        assert liveness.reap_once() == 1
    assert [Generation.objects.get(pk=g.pk).status for g in (stranded, fresh, beating)] == [
        "error",
        "running",
        "running",
    ]
