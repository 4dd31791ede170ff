"""Cache-aware routing as the app uses it: where `enqueue` sends a turn, the worker-side claim
that makes a re-sent copy a no-op, and the owner a finished chat turn leaves behind."""

from __future__ import annotations

from typing import Any

import pytest

from playground import dispatch
from playground.coord import store, worker_routing
from playground.models import Generation
from playground.web import submit
from tests.playground.sent_tasks import on_task
from tests.playground.worker.test_generation import queue_chat, run

from .fake_engine import FakeEngine

pytestmark = pytest.mark.django_db


def sent_queues(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    sent: list[tuple[int, str]] = []
    on_task(
        monkeypatch, "run_generation", apply_async=lambda args, queue=None, **options: sent.append((args[0], queue))
    )
    return sent


def test_a_chat_turn_records_its_worker_and_the_next_turn_goes_there(
    owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = queue_chat(owner, "Hi!")
    run(first.generation_id, FakeEngine("Hello"))
    r = store.client()
    assert worker_routing.owner_of(r, first.conversation_id) == "worker-1"

    sent = sent_queues(monkeypatch)
    r.set(worker_routing.alive_key("worker-1"), 1)
    dispatch.enqueue(99, conversation_id=first.conversation_id)
    worker_routing.set_busy(r, "worker-1", True)
    dispatch.enqueue(100, conversation_id=first.conversation_id)
    assert sent == [(99, worker_routing.worker_queue("worker-1")), (100, worker_routing.SHARED_QUEUE)]


def test_sending_a_committed_generation_reads_no_database(
    owner: str, monkeypatch: pytest.MonkeyPatch, django_assert_num_queries: Any
) -> None:
    """The web process sends off its one database thread (`dispatch.enqueue`): a burst of
    requests then does not queue each send behind the others' row creations."""
    first = queue_chat(owner, "Hi!")
    run(first.generation_id, FakeEngine("Hello"))
    store.client().set(worker_routing.alive_key("worker-1"), 1)
    sent = sent_queues(monkeypatch)
    with django_assert_num_queries(0):
        dispatch.enqueue(99, conversation_id=first.conversation_id)
        dispatch.enqueue_choices([100])
    assert sent == [(99, worker_routing.worker_queue("worker-1")), (100, worker_routing.SHARED_QUEUE)]


def test_a_generation_claimed_elsewhere_is_not_run_twice(owner: str) -> None:
    queued = queue_chat(owner, "Hi!")
    assert worker_routing.claim_delivery(store.client(), queued.generation_id, "worker-0")
    assert run(queued.generation_id) == []  # the copy that lost the claim does nothing
    assert Generation.objects.get(pk=queued.generation_id).status == Generation.Status.QUEUED


def stranded_turn(owner: str) -> submit.Queued:
    """A chat turn routed to its conversation's worker, which then dies before claiming the task."""
    queued = queue_chat(owner, "Hi!")
    r = store.client()
    worker_routing.record_owner(r, queued.conversation_id, "gone")
    r.set(worker_routing.alive_key("gone"), 1)
    assert worker_routing.route(r, queued.generation_id, queued.conversation_id) == "gpu.gone"
    r.delete(worker_routing.alive_key("gone"))
    return queued


def test_a_turn_stranded_on_a_dead_workers_queue_is_resent_once(owner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    queued = stranded_turn(owner)
    sent = sent_queues(monkeypatch)
    assert dispatch.reroute_if_stranded(queued.generation_id)
    assert not dispatch.reroute_if_stranded(queued.generation_id)
    assert sent == [(queued.generation_id, worker_routing.SHARED_QUEUE)]
    events = run(queued.generation_id)
    assert events[-1]["type"] == "generation.finished"
