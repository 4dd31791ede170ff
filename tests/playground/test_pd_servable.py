"""A request no live worker can serve is refused at once (`no_worker_for_mode`), before
anything is written; and a user can always stop their queued generations, also from a new
socket (a reloaded page)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from playground import protocol
from playground.coord import keys, liveness, store
from playground.models import Conversation, Generation
from tests.playground.sent_tasks import on_task
from tests.playground.web.test_consumer import TIMEOUT_S, assert_refused, command, connect

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """What the consumer enqueues, instead of sending it to a broker."""
    calls: list[tuple[str, int]] = []
    on_task(monkeypatch, "run_prefill", delay=lambda generation_id: calls.append(("prefill", generation_id)))
    on_task(monkeypatch, "run_generation", apply_async=lambda args, **options: calls.append(("gpu", args[0])))
    return calls


@pytest.fixture
async def ws(session_key: str, sent: list) -> AsyncIterator[WebsocketCommunicator]:
    communicator = connect(session_key)
    assert (await communicator.connect(timeout=TIMEOUT_S))[0]
    yield communicator
    await communicator.disconnect()


@pytest.fixture
def announce() -> Iterator[Callable[..., liveness.Heartbeat]]:
    """Starts a worker's queue heartbeat, as `tasks._announce_worker` does; stopped after the test."""
    beats: list[liveness.Heartbeat] = []

    def start(*queues: str) -> liveness.Heartbeat:
        beat = liveness.start_queue_heartbeat(f"w-{'-'.join(queues)}@test", queues)
        assert beat is not None
        beats.append(beat)
        return beat

    yield start
    for beat in beats:
        beat.stop()  # once stopped, a no-op


async def test_pd_without_prefill_and_decode_workers_is_refused_and_nothing_is_written(
    ws: WebsocketCommunicator, sent: list, announce: Callable
) -> None:
    announce("gpu", "celery")  # `make run`: one colocated worker
    refusal = await assert_refused(ws, "no_worker_for_mode", "generate", content="hi", pd=True)
    assert "a prefill worker and a decode worker" in refusal["message"]
    assert '"pd": false' in refusal["message"]
    await assert_refused(ws, "no_worker_for_mode", "complete", text="hi", pd=True)
    assert sent == [] and not await sync_to_async(Generation.objects.exists)()
    assert not await sync_to_async(Conversation.objects.exists)()
    # The same request colocated goes through.
    assert (await command(ws, "generate", content="hi", pd=False))["type"] == "generation.queued"


async def test_the_missing_role_is_named(ws: WebsocketCommunicator, announce: Callable) -> None:
    announce("prefill")
    refusal = await assert_refused(ws, "no_worker_for_mode", "complete", text="hi", pd=True)
    assert "needs a decode worker," in refusal["message"] and "prefill worker" not in refusal["message"]


async def test_the_server_default_mode_is_checked_too(ws: WebsocketCommunicator, settings: Any) -> None:
    settings.PLAYGROUND_PD_MODE = "disaggregated"
    await assert_refused(ws, "no_worker_for_mode", "complete", text="hi")


async def test_pd_with_both_workers_seen_is_queued_on_prefill(
    ws: WebsocketCommunicator, sent: list, announce: Callable
) -> None:
    announce("prefill")
    announce("decode")
    queued = await command(ws, "complete", text="hi", pd=True)
    assert queued["type"] == "generation.queued"
    assert sent == [("prefill", queued["generation_id"])]


def test_queue_heartbeat_keys_live_long_enough_for_a_restart_and_go_on_stop(announce: Callable) -> None:
    beat = announce("prefill", "decode")
    r = store.client()
    key = keys.queue_consumer("prefill", "w-prefill-decode@test")
    assert liveness.queue_has_consumer("prefill") and liveness.queue_has_consumer("decode")
    assert liveness.QUEUE_SEEN_TTL_S - 2 <= r.pttl(key) / 1000 <= liveness.QUEUE_SEEN_TTL_S
    assert not r.exists(keys.worker_alive("w-prefill-decode@test"))  # not counted as a generation worker
    beat.stop()
    assert not liveness.queue_has_consumer("prefill") and not liveness.queue_has_consumer("decode")


async def test_a_new_socket_of_the_session_stops_a_queued_generation(session_key: str, sent: list) -> None:
    first = connect(session_key)
    assert (await first.connect(timeout=TIMEOUT_S))[0]
    ids = [(await command(first, "complete", text=f"q{i}"))["generation_id"] for i in range(2)]
    await assert_refused(first, "too_many_generations", "complete", text="third")
    await first.disconnect()  # the page reloads

    second = connect(session_key)
    assert (await second.connect(timeout=TIMEOUT_S))[0]
    for generation_id in ids:
        ended = await command(second, "stop", generation_id=generation_id)
        assert (ended["type"], ended["generation_id"], ended["finish_reason"]) == (
            "generation.finished",
            generation_id,
            "cancelled",
        )
    assert await second.receive_nothing(timeout=2.5)  # exactly one terminal event each (the watchdog is quiet)
    assert (await command(second, "complete", text="again"))["type"] == "generation.queued"
    await second.disconnect()


async def test_a_new_socket_that_stops_a_running_generation_gets_its_end(session_key: str, sent: list) -> None:
    first = connect(session_key)
    assert (await first.connect(timeout=TIMEOUT_S))[0]
    generation_id = (await command(first, "complete", text="q"))["generation_id"]
    await first.disconnect()
    await sync_to_async(Generation.objects.filter(pk=generation_id).update)(status="running", started_at=timezone.now())
    store.client().set(keys.generation_alive(generation_id), 1, ex=30)  # its worker is alive

    second = connect(session_key)
    assert (await second.connect(timeout=TIMEOUT_S))[0]
    await second.send_json_to({"command": "stop", "generation_id": generation_id})
    assert await second.receive_nothing(timeout=0.3)  # the worker reports the end
    event = protocol.generation_finished(generation_id, None, "cancelled", "", {})
    await get_channel_layer().group_send(protocol.group_name(generation_id), {**event, "type": "generation.finished"})
    ended = await second.receive_json_from(timeout=TIMEOUT_S)
    assert (ended["type"], ended["finish_reason"]) == ("generation.finished", "cancelled")
    await second.disconnect()
