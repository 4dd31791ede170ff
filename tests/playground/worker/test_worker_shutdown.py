"""A worker told to shut down (SIGTERM, Ctrl-C: Celery's `worker_shutting_down`) ends its running
generations at their next step, each with its terminal event and its row saved, instead of
leaving them `running` until someone reads them after the kill that ends the grace period."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from playground import tasks
from playground.models import Generation, Message
from playground.protocol import is_terminal
from playground.web import submit
from playground.worker import generation
from tests.playground.fake_engine import FakeEngine, run_on_a_thread

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)  # the run is on another thread


@pytest.fixture(autouse=True)
def fresh_worker_state() -> Iterator[None]:
    yield
    generation._stopping.clear()  # the flag is set once per worker process; tests share one


def test_shutdown_ends_a_running_generation_as_worker_lost_with_its_partial_answer(owner: str) -> None:
    queued = submit.generate(owner, {"content": "Hi!", "overrides": {"max_new_tokens": 500}})
    steps_run: list[int] = []
    engine = FakeEngine("y" * 400, on_step=lambda index: (steps_run.append(index), time.sleep(0.01)))
    run, events = run_on_a_thread(queued.generation_id, engine, steps_run)
    tasks._stop_generations(sig=None, how="Warm", exitcode=0)  # what Celery's signal calls
    run.join(timeout=30)
    assert not run.is_alive()

    terminal = [event for event in events if is_terminal(event)]
    assert [(e["type"], e["code"]) for e in terminal] == [("generation.error", "worker_lost")]
    assert "was stopped" in terminal[0]["message"]
    row = Generation.objects.get(pk=queued.generation_id)
    assert (row.status, row.error_code) == ("error", "worker_lost")  # not "running"
    assert row.text and set(row.text) == {"y"} and len(row.text) < 400
    assert Message.objects.get(pk=queued.message_id).content == row.text


def test_a_generation_that_starts_during_the_shutdown_ends_at_once(owner: str) -> None:
    queued = submit.generate(owner, {"content": "Hi!", "overrides": {"max_new_tokens": 300}})
    generation.stop_for_shutdown()
    events: list[dict[str, Any]] = []
    generation.run_generation(
        queued.generation_id, "worker-1", load_engine=lambda model: FakeEngine("z" * 300), send=events.append
    )
    assert (events[-1]["type"], events[-1]["code"]) == ("generation.error", "worker_lost")
    assert len(Generation.objects.get(pk=queued.generation_id).text) < 300
