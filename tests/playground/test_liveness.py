"""The one rule that declares a generation lost, and the heartbeats it reads."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from playground.coord import liveness
from playground.models import Generation

from .conftest import make_generation

pytestmark = pytest.mark.django_db

LONG_AGO = timedelta(minutes=5)


def running_since(owner: str, age: timedelta) -> Generation:
    return make_generation(owner, status="running", started_at=timezone.now() - age)


def test_a_running_generation_without_heartbeat_is_lost(owner: str) -> None:
    generation = running_since(owner, LONG_AGO)
    assert liveness.mark_lost_if_stale(generation)
    generation.refresh_from_db()
    assert (generation.status, generation.error_code) == ("error", "worker_lost")
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


def test_a_queued_generation_is_lost_only_when_no_worker_lives(owner: str) -> None:
    generation = make_generation(owner)
    Generation.objects.filter(pk=generation.pk).update(created_at=timezone.now() - LONG_AGO)
    generation.refresh_from_db()
    worker = liveness.start_worker_heartbeat("test-worker")
    try:
        assert not liveness.mark_lost_if_stale(generation)  # a busy worker will get to it: keep waiting
    finally:
        worker.stop()
    assert liveness.mark_lost_if_stale(generation)
    generation.refresh_from_db()
    assert "no worker" in generation.error_message
