"""Losing Redis, unit by unit (the live version: tests/system/test_redis_loss.py): the worker
ends a generation it can no longer publish as `service_unavailable` (never a raw connection
error), keeps its partial answer and takes it out of the engine's batch; the socket stays open,
gets one terminal event per generation it follows, refuses new work while Redis is gone and
takes it again once it is back; the serving page's socket joins its group again."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.layers import InMemoryChannelLayer, get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from playground import protocol
from playground.asgi import application
from playground.models import Generation, Message
from playground.web import submit
from playground.worker import generation
from tests.playground.fake_engine import FakeEngine

from .test_consumer import HOST, ORIGIN, TIMEOUT_S, command, connect

REFUSED = "Error 111 connecting to 127.0.0.1:6390. Connection refused."


class FlakyLayer(InMemoryChannelLayer):
    """The in-memory layer, except that every call fails as channels_redis' do while `is_down`
    (a receive already waiting fails too, as a dropped connection makes it)."""

    is_down = False

    def _check(self) -> None:
        if self.is_down:
            raise redis.ConnectionError(REFUSED)

    async def receive(self, channel: str) -> dict[str, Any]:
        self._check()
        waiting = asyncio.ensure_future(super().receive(channel))
        while not (await asyncio.wait({waiting}, timeout=0.02))[0]:
            if self.is_down:
                waiting.cancel()
                self._check()
        return waiting.result()

    async def group_add(self, group: str, channel: str) -> None:
        self._check()
        await super().group_add(group, channel)

    async def group_discard(self, group: str, channel: str) -> None:
        self._check()
        await super().group_discard(group, channel)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        self._check()
        await super().group_send(group, message)


@pytest.fixture
def layer(settings: Any) -> FlakyLayer:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.FlakyLayer"}}
    return get_channel_layer()


# ---- the worker --------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_worker_that_cannot_publish_ends_as_service_unavailable_and_frees_its_place(owner: str) -> None:
    queued = submit.generate(owner, {"content": "Hi!", "overrides": {"max_new_tokens": 500}})
    steps_run: list[int] = []
    sent: list[dict[str, Any]] = []

    def send(event: dict[str, Any]) -> None:
        if any(e["type"] == "generation.tokens" for e in sent):  # Redis died after the first batch of tokens
            raise redis.ConnectionError(REFUSED)
        sent.append(event)

    def step(index: int) -> None:  # a model's pace: the loop's cancel watch reads the flags every 50 ms
        steps_run.append(index)
        time.sleep(0.002)

    engine = FakeEngine("x" * 400, on_step=step)
    generation.run_generation(queued.generation_id, "worker-1", load_engine=lambda model: engine, send=send)

    row = Generation.objects.get(pk=queued.generation_id)
    assert (row.status, row.error_code, row.error_message) == (
        "error",
        "service_unavailable",
        generation.store.OUTAGE_MESSAGE,
    )
    assert row.text and set(row.text) == {"x"}  # the partial answer was kept
    assert Message.objects.get(pk=queued.message_id).content == row.text
    assert not any(protocol.is_terminal(event) for event in sent)  # nobody could be told: the row says it
    deadline = time.monotonic() + TIMEOUT_S
    while engine.has_unfinished and time.monotonic() < deadline:  # the engine loop cancels it
        time.sleep(0.01)
    assert not engine.has_unfinished and len(steps_run) < 400, len(steps_run)


# ---- the generation socket ---------------------------------------------------------------


pytestmark_db = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytestmark_db
async def test_a_socket_survives_the_outage_with_one_terminal_event_per_generation(
    layer: FlakyLayer, session_key: str, queued_ids: list[int]
) -> None:
    ws, idle = connect(session_key), connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0] and (await idle.connect(timeout=TIMEOUT_S))[0]
    waiting = await command(ws, "generate", content="still queued")
    running = await command(ws, "complete", text="already running")
    await sync_to_async(Generation.objects.filter(pk=running["generation_id"]).update)(
        status="running", started_at=timezone.now()
    )

    layer.is_down = True
    ended = await ws.receive_json_from(timeout=TIMEOUT_S)  # the queued one, at once
    assert (ended["type"], ended["generation_id"], ended["code"]) == (
        "generation.error",
        waiting["generation_id"],
        "service_unavailable",
    )
    assert "Error 111" not in ended["message"]
    refusal = await command(ws, "generate", content="while Redis is gone")  # nothing is written
    assert (refusal["type"], refusal["code"]) == ("error", "service_unavailable")
    assert await sync_to_async(Generation.objects.count)() == 2

    # The running one's worker cannot publish either: it saves the end, the watchdog reports it.
    await sync_to_async(Generation.objects.filter(pk=running["generation_id"]).update)(
        status="error", error_code="service_unavailable", error_message=generation.store.OUTAGE_MESSAGE, text="Par"
    )
    ended = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (ended["generation_id"], ended["code"]) == (running["generation_id"], "service_unavailable")
    assert await ws.receive_nothing(timeout=1.5)  # exactly one terminal event each
    assert await idle.receive_nothing(timeout=0.1)  # the idle socket saw nothing and stays open

    layer.is_down = False
    for socket in (ws, idle):  # both take work again once the layer answers
        for _ in range(50):
            answer = await command(socket, "complete", text="again")
            if answer["type"] == "generation.queued":
                break
            assert answer["code"] == "service_unavailable"
            await asyncio.sleep(0.1)
        assert answer["type"] == "generation.queued"
        await socket.disconnect()
    rows = await sync_to_async(list)(Generation.objects.filter(pk__in=[waiting["generation_id"]]))
    assert [(r.status, r.error_code) for r in rows] == [("error", "service_unavailable")]


@pytestmark_db
async def test_a_socket_that_cannot_reach_redis_when_it_starts_a_generation_fails_it_clearly(
    layer: FlakyLayer, session_key: str, queued_ids: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis went away between the last receive and this command: the row is written, then the
    group cannot be joined. It ends at once, with one clear terminal event; nothing stays queued."""
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]

    async def refused(group: str, channel: str) -> None:
        raise redis.ConnectionError(REFUSED)

    monkeypatch.setattr(layer, "group_add", refused)
    queued = await command(ws, "complete", text="hi")
    assert queued["type"] == "generation.queued"
    ended = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (ended["type"], ended["code"]) == ("generation.error", "service_unavailable")
    assert queued_ids == []
    row = await sync_to_async(Generation.objects.get)(pk=queued["generation_id"])
    assert (row.status, row.error_code) == ("error", "service_unavailable")
    await ws.disconnect()


@pytestmark_db
async def test_the_serving_socket_joins_its_group_again_after_the_outage(layer: FlakyLayer) -> None:
    ws = WebsocketCommunicator(application, "/ws/serving/", headers=[HOST, ORIGIN])
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    layer.is_down = True
    await asyncio.sleep(0.2)
    layer.groups.clear()  # a restarted Redis has forgotten every group
    layer.is_down = False
    for _ in range(100):
        await asyncio.sleep(0.05)
        if layer.groups.get(protocol.SERVING_GROUP):
            break
    assert (await ws.receive_json_from(timeout=TIMEOUT_S))["type"] == "serving.workers"  # said on connect
    await layer.group_send(protocol.SERVING_GROUP, {"type": "serving.step", "step": 1})
    assert (await ws.receive_json_from(timeout=TIMEOUT_S))["step"] == 1
    await ws.disconnect()
