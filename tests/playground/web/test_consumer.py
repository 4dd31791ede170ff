"""The generation WebSocket over the in-memory channel layer: refusals (each with its code,
the socket still usable after), following a generation, stop, and the worker watchdog."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.utils import timezone

from playground import protocol
from playground.asgi import application
from playground.coord import cancel, recent_steps
from playground.models import Conversation, Generation, Message
from playground.web import following
from playground.worker import generation
from tests.playground.fake_engine import FakeEngine
from tests.playground.sent_tasks import on_task

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)  # keep the migrated rows

TIMEOUT_S = 10  # generous: only a bound on a hang, never a measurement
ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")  # the page and its socket share one origin, as in a browser


@pytest.fixture
async def ws(session_key: str, queued_ids: list[int]) -> AsyncIterator[WebsocketCommunicator]:
    communicator = connect(session_key)
    connected, _ = await communicator.connect(timeout=TIMEOUT_S)
    assert connected
    yield communicator
    await communicator.disconnect()


def connect(session_key: str | None = None, origin: tuple[bytes, bytes] = ORIGIN) -> WebsocketCommunicator:
    headers = [HOST, origin] + ([(b"cookie", f"sessionid={session_key}".encode())] if session_key else [])
    return WebsocketCommunicator(application, "/ws/generate/", headers=headers)


async def command(ws: WebsocketCommunicator, name: str, **fields: Any) -> dict[str, Any]:
    await ws.send_json_to({"command": name, **fields})
    return await ws.receive_json_from(timeout=TIMEOUT_S)


async def command_to_end(ws: WebsocketCommunicator, name: str, **fields: Any) -> list[dict[str, Any]]:
    """The command's events: its first answer, then what follows up to its generation's terminal event."""
    events = [await command(ws, name, **fields)]
    while not protocol.is_terminal(events[-1]):
        events.append(await ws.receive_json_from(timeout=TIMEOUT_S))
    return events


def token_steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps of the `generation.tokens` events, in order."""
    return [s for e in events if e["type"] == "generation.tokens" for s in e["steps"]]


async def assert_refused(ws: WebsocketCommunicator, code: str, name: str, **fields: Any) -> dict[str, Any]:
    """The command is refused with `code`, and the socket still answers the next command."""
    refusal = await command(ws, name, request_id="r-bad", **fields)
    assert (refusal["type"], refusal["code"], refusal["request_id"]) == ("error", code, "r-bad"), refusal
    follow_up = await command(ws, "no-such-command", request_id="r-next")
    assert (follow_up["code"], follow_up["request_id"]) == ("unknown_command", "r-next")
    return refusal


async def test_bad_json_is_refused_and_the_socket_stays_usable(ws: WebsocketCommunicator) -> None:
    await ws.send_to(text_data="{not json")
    refusal = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (refusal["type"], refusal["code"]) == ("error", "bad_json")
    await ws.send_to(text_data="[1, 2]")
    assert (await ws.receive_json_from(timeout=TIMEOUT_S))["code"] == "bad_json"
    await assert_refused(ws, "unknown_command", "fly")
    await assert_refused(ws, "unknown_command", ["generate"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"content": 5}, "content=5"),
        ({"content": "  "}, "must not be empty"),
        ({"content": "hi", "conversation_id": "7"}, "conversation_id='7'"),
        ({"content": "hi", "overrides": [1]}, "overrides=[1]"),
        ({"content": "hi", "model_id": True}, "model_id=True"),
    ],
)
async def test_fields_of_the_wrong_type_are_invalid_field(
    ws: WebsocketCommunicator, fields: dict, fragment: str
) -> None:
    refusal = await assert_refused(ws, "invalid_field", "generate", **fields)
    assert fragment in refusal["message"]


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_k": 2.5}, "top_k=2.5"),
        ({"warp_speed": 9}, "warp_speed"),
        ({"max_new_tokens": 10**6}, "server's limit"),
        ({"max_thinking_tokens": -1}, "max_thinking_tokens=-1"),
        ({"max_thinking_tokens": "3"}, "max_thinking_tokens='3'"),
        ({"max_thinking_tokens": 4, "num_beams": 2}, "max_thinking_tokens=4 does not apply to beam search"),
    ],
)
async def test_invalid_sampling_settings_are_invalid_params(
    ws: WebsocketCommunicator, overrides: dict, fragment: str, queued_ids: list[int]
) -> None:
    refusal = await assert_refused(ws, "invalid_params", "generate", content="hi", overrides=overrides)
    assert fragment in refusal["message"]
    assert queued_ids == [] and not await sync_to_async(Conversation.objects.exists)()


async def test_an_oversize_prompt_is_refused_and_nothing_is_written(ws: WebsocketCommunicator, settings: Any) -> None:
    settings.PLAYGROUND_MAX_PROMPT_CHARS = 10
    await assert_refused(ws, "prompt_too_long", "generate", content="x" * 11)
    await assert_refused(ws, "prompt_too_long", "complete", text="x" * 11)
    assert not await sync_to_async(Generation.objects.exists)()


async def test_missing_records_are_not_found(ws: WebsocketCommunicator) -> None:
    await assert_refused(ws, "not_found", "generate", content="hi", conversation_id=999)
    await assert_refused(ws, "not_found", "generate", content="hi", preset_id=999)
    await assert_refused(ws, "not_found", "regenerate", message_id=999)
    await assert_refused(ws, "not_found", "stop", generation_id=999)


async def test_another_sessions_records_are_not_found(ws: WebsocketCommunicator) -> None:
    other = await command(ws, "generate", content="mine")
    stranger = connect()  # no cookie: the consumer gives it a fresh session
    assert (await stranger.connect(timeout=TIMEOUT_S))[0]
    await assert_refused(stranger, "not_found", "generate", content="hi", conversation_id=other["conversation_id"])
    await assert_refused(stranger, "not_found", "stop", generation_id=other["generation_id"])
    await stranger.disconnect()


async def test_a_regenerate_of_a_user_message_is_invalid_field(ws: WebsocketCommunicator) -> None:
    queued = await command(ws, "generate", content="hi")
    await assert_refused(ws, "invalid_field", "regenerate", message_id=queued["user_message_id"])


async def test_generate_is_queued_with_its_records_and_enqueued(
    ws: WebsocketCommunicator, queued_ids: list[int]
) -> None:
    queued = await command(ws, "generate", request_id="r1", content="Hello?", system_prompt="Be brief.")
    assert (queued["type"], queued["request_id"]) == ("generation.queued", "r1")
    assert queued_ids == [queued["generation_id"]]
    conversation = await sync_to_async(Conversation.objects.get)(pk=queued["conversation_id"])
    assert (conversation.title, conversation.system_prompt) == ("Hello?", "Be brief.")
    answer = await sync_to_async(Message.objects.get)(pk=queued["message_id"])
    assert (answer.role, answer.generation_id) == ("assistant", queued["generation_id"])


async def test_too_many_concurrent_generations_are_refused(ws: WebsocketCommunicator, settings: Any) -> None:
    settings.PLAYGROUND_MAX_CONCURRENT_PER_CLIENT = 1
    queued = await command(ws, "generate", content="one")
    assert queued["type"] == "generation.queued"
    await assert_refused(
        ws, "too_many_generations", "generate", content="two", conversation_id=queued["conversation_id"]
    )
    await assert_refused(ws, "too_many_generations", "complete", text="two")


async def test_stop_sets_the_flag_the_worker_reads(ws: WebsocketCommunicator) -> None:
    queued = await command(ws, "generate", content="hi")
    await sync_to_async(Generation.objects.filter(pk=queued["generation_id"]).update)(
        status="running", started_at=timezone.now()
    )
    await ws.send_json_to({"command": "stop", "generation_id": queued["generation_id"]})
    assert await ws.receive_nothing(timeout=0.2)  # the worker will report the end, not the consumer
    assert await sync_to_async(cancel.is_cancel_requested)(queued["generation_id"])


async def test_stopping_a_queued_generation_ends_it_at_once(ws: WebsocketCommunicator) -> None:
    queued = await command(ws, "generate", content="hi")
    finished = await command(ws, "stop", generation_id=queued["generation_id"])
    assert (finished["type"], finished["finish_reason"], finished["message_id"]) == (
        "generation.finished",
        "cancelled",
        queued["message_id"],
    )
    generation = await sync_to_async(Generation.objects.get)(pk=queued["generation_id"])
    assert generation.status == "cancelled"


async def test_a_foreign_origin_cannot_connect(session_key: str) -> None:
    communicator = connect(session_key, origin=(b"origin", b"http://evil.example"))
    connected, _ = await communicator.connect(timeout=TIMEOUT_S)
    assert not connected


async def test_events_of_a_generation_flow_from_the_worker_to_the_socket(
    session_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "Eager" worker: the enqueued task runs the real runner (with a fake engine) at once.
    on_task(
        monkeypatch,
        "run_generation",
        apply_async=lambda args, **options: generation.run_generation(
            args[0], "eager", load_engine=lambda model: FakeEngine("Hi you")
        ),
    )
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    events = await command_to_end(ws, "generate", content="Hello?")
    assert [e["type"] for e in events[:3]] == ["generation.queued", "generation.started", "generation.prefilled"]
    assert "".join(s["text_delta"] for s in token_steps(events)) == "Hi you"
    assert (events[-1]["type"], events[-1]["text"], events[-1]["message_id"]) == (
        "generation.finished",
        "Hi you",
        events[0]["message_id"],
    )
    assert await ws.receive_nothing(timeout=0.2)
    await ws.disconnect()


async def test_a_dead_worker_is_reported_once_and_later_events_are_dropped(
    ws: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(following, "WATCH_INTERVAL_S", 0.05)
    queued = await command(ws, "generate", content="hi")
    generation_id = queued["generation_id"]
    # A worker took it long ago and has stopped beating (no heartbeat key), leaving a partial answer.
    long_ago = timezone.now() - timedelta(minutes=1)
    await sync_to_async(Generation.objects.filter(pk=generation_id).update)(status="running", started_at=long_ago)
    await sync_to_async(Message.objects.filter(pk=queued["message_id"]).update)(content="Par")

    error = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (error["type"], error["code"], error["generation_id"]) == ("generation.error", "worker_lost", generation_id)
    # The worker's own terminal event arriving late is not a second one.
    await get_channel_layer().group_send(
        protocol.group_name(generation_id),
        protocol.generation_finished(generation_id, queued["message_id"], "length", "late", {}),
    )
    assert await ws.receive_nothing(timeout=0.3)
    message = await sync_to_async(Message.objects.get)(pk=queued["message_id"])
    assert message.content == "Par"


async def test_a_worker_terminal_event_is_not_repeated_by_the_watchdog(
    ws: WebsocketCommunicator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(following, "WATCH_INTERVAL_S", 0.05)
    queued = await command(ws, "generate", content="hi")
    generation_id = queued["generation_id"]
    await sync_to_async(Generation.objects.filter(pk=generation_id).update)(status="finished", finish_reason="eos")
    await get_channel_layer().group_send(
        protocol.group_name(generation_id),
        protocol.generation_finished(generation_id, queued["message_id"], "eos", "done", {}),
    )
    finished = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (finished["type"], finished["text"]) == ("generation.finished", "done")
    assert await ws.receive_nothing(timeout=0.3)


async def test_an_unreachable_queue_ends_the_generation_with_a_clear_error(
    session_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broker_down(args: tuple[int], **options: Any) -> None:
        raise ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    on_task(monkeypatch, "run_generation", apply_async=broker_down)
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    queued = await command(ws, "generate", content="hi")
    error = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (queued["type"], error["type"], error["code"]) == (
        "generation.queued",
        "generation.error",
        "service_unavailable",
    )
    assert "Redis" in error["message"] and "Error 111" not in error["message"]
    row = await sync_to_async(Generation.objects.get)(pk=queued["generation_id"])
    assert (row.status, row.error_code) == ("error", "service_unavailable")
    await ws.disconnect()


async def test_a_reloaded_page_attaches_to_its_running_generation_and_gets_what_was_saved_then_the_rest(
    session_key: str, queued_ids: list[int]
) -> None:
    first = connect(session_key)
    assert (await first.connect(timeout=TIMEOUT_S))[0]
    queued = await command(first, "generate", content="hi")
    await first.disconnect()  # the page reloads
    generation_id = queued["generation_id"]
    saved = [{"index": 0, "text_delta": "He"}, {"index": 1, "text_delta": "llo"}]
    await sync_to_async(Generation.objects.filter(pk=generation_id).update)(
        status="running", started_at=timezone.now(), text="Hello", steps=saved
    )
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    attached = await command(ws, "attach", generation_id=generation_id, request_id="a1")
    assert (attached["type"], attached["request_id"], attached["status"]) == ("generation.attached", "a1", "running")
    assert (attached["text"], attached["steps"]) == ("Hello", saved)
    await get_channel_layer().group_send(
        protocol.group_name(generation_id), protocol.generation_steps(generation_id, ['{"index":2}'], is_beam=False)
    )
    assert (await ws.receive_json_from(timeout=TIMEOUT_S))["steps"] == [{"index": 2}]
    await get_channel_layer().group_send(
        protocol.group_name(generation_id),
        protocol.generation_finished(generation_id, queued["message_id"], "length", "Hello!", {}),
    )
    assert (await ws.receive_json_from(timeout=TIMEOUT_S))["type"] == "generation.finished"
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_an_attach_between_two_saves_gets_the_steps_published_since_the_last_save(
    session_key: str, queued_ids: list[int]
) -> None:
    """The row is saved about once a second; the steps published since wait in Redis
    (coord/recent_steps.py): the snapshot has them all, so the live stream goes on without a gap."""
    first = connect(session_key)
    assert (await first.connect(timeout=TIMEOUT_S))[0]
    queued = await command(first, "generate", content="hi")
    await first.disconnect()
    generation_id = queued["generation_id"]
    saved = [{"index": 0, "text_delta": "He"}, {"index": 1, "text_delta": "llo"}]
    await sync_to_async(Generation.objects.filter(pk=generation_id).update)(
        status="running", started_at=timezone.now(), text="Hello", steps=saved, params={"greedy": True}
    )
    published = [{"index": 1, "text_delta": "llo"}, {"index": 2, "text_delta": ","}, {"index": 3, "text_delta": " you"}]
    encoded = [(step["index"], json.dumps(step)) for step in published]
    await sync_to_async(recent_steps.append)(generation_id, encoded)  # one already saved, two not yet
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    attached = await command(ws, "attach", generation_id=generation_id)
    assert [s["index"] for s in attached["steps"]] == [0, 1, 2, 3]
    assert attached["text"] == "Hello, you"
    assert attached["params"] == {"greedy": True}  # the page draws greedy's steps from it
    await ws.disconnect()


async def test_attaching_to_an_ended_generation_gives_its_terminal_event_and_others_get_not_found(
    ws: WebsocketCommunicator,
) -> None:
    queued = await command(ws, "generate", content="hi")
    generation_id = queued["generation_id"]
    await sync_to_async(Generation.objects.filter(pk=generation_id).update)(
        status="cancelled", finish_reason="cancelled", text="Hel"
    )
    attached = await command(ws, "attach", generation_id=generation_id)
    assert (attached["type"], attached["status"], attached["text"]) == ("generation.attached", "cancelled", "Hel")
    ended = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (ended["type"], ended["finish_reason"]) == ("generation.finished", "cancelled")
    stranger = connect("another-session-key-000000000000")
    assert (await stranger.connect(timeout=TIMEOUT_S))[0]
    refused = await command(stranger, "attach", generation_id=generation_id)
    assert (refused["type"], refused["code"]) == ("error", "not_found")
    await stranger.disconnect()
