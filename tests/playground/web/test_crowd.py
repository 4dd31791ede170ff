"""A crowd: a bound on all queued work (`server_busy`), and cookie-less sockets cost no session
rows."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.contrib.sessions.models import Session
from django.utils import timezone

from playground.models import Generation
from tests.playground.conftest import make_generation
from tests.playground.sent_tasks import on_task

from .test_consumer import TIMEOUT_S, assert_refused, command, connect

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the consumer enqueues goes nowhere: these tests are about what gets queued."""
    on_task(monkeypatch, "run_generation", apply_async=lambda args, **options: None)


async def test_sockets_that_do_nothing_create_no_sessions() -> None:
    before = await sync_to_async(Session.objects.count)()
    for _ in range(20):  # cookie-less clients, as a crowd of scripts opens them
        ws = connect()
        assert (await ws.connect(timeout=TIMEOUT_S))[0]
        await ws.disconnect()
    assert await sync_to_async(Session.objects.count)() == before


async def test_a_cookieless_socket_owns_what_it_starts_without_a_session_row() -> None:
    before = await sync_to_async(Session.objects.count)()
    ws = connect()
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    await assert_refused(ws, "not_found", "stop", generation_id=1)  # no owner yet: nothing is its own
    queued = await command(ws, "complete", text="hi")
    assert queued["type"] == "generation.queued"
    ended = await command(ws, "stop", generation_id=queued["generation_id"])  # its own, on this socket
    assert ended["finish_reason"] == "cancelled"
    assert (await command(ws, "complete", text="again"))["type"] == "generation.queued"
    assert await sync_to_async(Session.objects.count)() == before  # the socket holds its owner itself
    await ws.disconnect()
    other = connect()  # another cookie-less socket is another owner
    assert (await other.connect(timeout=TIMEOUT_S))[0]
    await assert_refused(other, "not_found", "stop", generation_id=queued["generation_id"])
    await other.disconnect()


async def test_a_full_server_queue_is_server_busy_and_the_socket_stays_usable(
    session_key: str, owner: str, settings: Any
) -> None:
    settings.PLAYGROUND_MAX_QUEUED = 3
    others = [await sync_to_async(make_generation)(f"other-{i}" * 4) for i in range(3)]
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    refusal = await assert_refused(ws, "server_busy", "generate", content="hi")
    assert "3 requests are waiting for a worker (the limit is 3)" in refusal["message"]
    assert not await sync_to_async(Generation.objects.filter(owner=owner).exists)()
    await sync_to_async(Generation.objects.filter(pk=others[0].pk).update)(status="running")
    assert (await command(ws, "generate", content="hi"))["type"] == "generation.queued"
    await ws.disconnect()


async def test_queued_work_of_a_dead_worker_does_not_block_everyone(session_key: str, settings: Any) -> None:
    settings.PLAYGROUND_MAX_QUEUED = 2
    long_ago = timezone.now() - timedelta(seconds=settings.PLAYGROUND_QUEUE_TIMEOUT_S + 5)
    for i in range(2):  # queued long ago, and no worker alive: the lost rule ends them
        generation = await sync_to_async(make_generation)(f"gone-{i}" * 4)
        await sync_to_async(Generation.objects.filter(pk=generation.pk).update)(created_at=long_ago)
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    assert (await command(ws, "complete", text="hi"))["type"] == "generation.queued"
    assert await sync_to_async(Generation.objects.filter(error_code="worker_lost").count)() == 2
    await ws.disconnect()
