"""Hostile frames on the generation WebSocket: each gets its own stable code and the socket
stays usable (docs/protocol.md), plus a property-based fuzz of the whole command surface."""

from __future__ import annotations

import json
import string
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from playground import protocol
from playground.models import Generation
from playground.web import frames

from .test_consumer import TIMEOUT_S, command, connect

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


@pytest.fixture
async def ws(session_key: str, queued_ids: list[int]) -> AsyncIterator[WebsocketCommunicator]:
    communicator = connect(session_key)
    assert (await communicator.connect(timeout=TIMEOUT_S))[0]
    yield communicator
    await communicator.disconnect()


async def refused_frame(ws: WebsocketCommunicator, raw: str, code: str) -> dict[str, Any]:
    """`raw` is refused with `code`, and the next command is answered."""
    await ws.send_to(text_data=raw)
    refusal = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (refusal["type"], refusal["code"]) == ("error", code), refusal
    follow_up = await command(ws, "no-such-command", request_id="r-next")
    assert (follow_up["code"], follow_up["request_id"]) == ("unknown_command", "r-next")
    return refusal


async def test_a_lone_surrogate_is_invalid_unicode_and_nothing_is_written(ws: WebsocketCommunicator) -> None:
    refusal = await refused_frame(
        ws, '{"command": "generate", "request_id": "r1", "content": "hi \\ud800"}', "invalid_unicode"
    )
    assert refusal["request_id"] == "r1" and "surrogate" in refusal["message"]
    await refused_frame(ws, '{"command": "generate", "content": "hi", "\\udfff": 1}', "invalid_unicode")
    await refused_frame(ws, '{"command": "complete", "request_id": "\\ud800", "text": "x"}', "invalid_unicode")
    assert not await sync_to_async(Generation.objects.exists)()


async def test_a_nul_character_is_invalid_unicode_and_nothing_is_written(ws: WebsocketCommunicator) -> None:
    """PostgreSQL's text cannot hold U+0000: it was an `internal_error` there, saved on SQLite."""
    refusal = await refused_frame(
        ws, '{"command": "generate", "request_id": "r1", "content": "hello\\u0000world"}', "invalid_unicode"
    )
    assert refusal["request_id"] == "r1" and "NUL" in refusal["message"]
    await refused_frame(ws, '{"command": "generate", "content": "hi", "system_prompt": "\\u0000"}', "invalid_unicode")
    await refused_frame(
        ws, '{"command": "complete", "text": "x", "overrides": {"stop": ["a\\u0000"]}}', "invalid_unicode"
    )
    assert not await sync_to_async(Generation.objects.exists)()
    # A backslash followed by "u0000" is text like any other.
    await ws.send_to(text_data=json.dumps({"command": "generate", "content": "write \\u0000 in JSON"}))
    assert (await ws.receive_json_from(timeout=TIMEOUT_S))["type"] == "generation.queued"


@pytest.mark.parametrize("depth", [frames.MAX_DEPTH + 1, 5_000, 200_000])
async def test_deeply_nested_json_is_nesting_too_deep(ws: WebsocketCommunicator, depth: int, settings: Any) -> None:
    settings.PLAYGROUND_MAX_MESSAGE_BYTES = 1024 * 1024
    raw = '{"command": "generate", "content": "hi", "overrides": ' + "[" * depth + "]" * depth + "}"
    refusal = await refused_frame(ws, raw, "nesting_too_deep")
    assert f"deeper than {frames.MAX_DEPTH} levels" in refusal["message"]


async def test_a_frame_over_the_limit_is_message_too_large(ws: WebsocketCommunicator, settings: Any) -> None:
    settings.PLAYGROUND_MAX_MESSAGE_BYTES = 1000
    raw = json.dumps({"command": "generate", "content": "é" * 500})  # 1,000 chars of text, more bytes
    refusal = await refused_frame(ws, raw, "message_too_large")
    assert refusal["message"] == f"the message has {len(raw.encode())} bytes; the limit is 1000"
    await ws.send_to(bytes_data=b" " * 1001)
    assert (await ws.receive_json_from(timeout=TIMEOUT_S))["code"] == "message_too_large"
    assert (await command(ws, "generate", content="small"))["type"] == "generation.queued"


async def test_the_default_limit_takes_a_whole_prompt_and_refuses_a_big_paste(ws: WebsocketCommunicator) -> None:
    # A prompt at the character limit, every character escaped as \\uXXXX, with the most images
    # allowed (base64) still fits...
    limit = frames.settings.PLAYGROUND_MAX_MESSAGE_BYTES
    images = frames.settings.PLAYGROUND_MAX_IMAGES * frames.settings.PLAYGROUND_MAX_IMAGE_BYTES * 4 // 3
    assert 32_000 * 6 + images + 1000 < limit < 16 * 1024 * 1024  # below daphne's drop
    # ...and a bigger paste that gets past daphne (e.g. a raised daphne limit) is answered, not dropped.
    await refused_frame(ws, json.dumps({"command": "generate", "content": "x" * (limit + 1000)}), "message_too_large")


@pytest.mark.parametrize("stop", [{"a": "b"}, 5, True])
async def test_stop_strings_of_the_wrong_shape_are_invalid_params(ws: WebsocketCommunicator, stop: Any) -> None:
    refusal = await command(ws, "generate", content="hi", overrides={"stop": stop})
    assert (refusal["type"], refusal["code"]) == ("error", "invalid_params"), refusal
    assert "must be a string or a list of strings" in refusal["message"]


async def test_a_stop_command_with_an_object_id_is_invalid_field(ws: WebsocketCommunicator) -> None:
    refusal = await command(ws, "stop", generation_id={"id": 1})
    assert (refusal["type"], refusal["code"]) == ("error", "invalid_field")


# ---- the fuzz ------------------------------------------------------------------------------

COMMANDS = ["generate", "regenerate", "edit", "complete", "stop"]
FIELDS = ["command", "request_id", "content", "text", "conversation_id", "message_id", "generation_id", "model_id",
          "preset_id", "overrides", "system_prompt", "pd", "chat", "token_ids"]  # fmt: skip
SETTINGS = ["max_new_tokens", "temperature", "top_k", "top_p", "stop", "seed", "num_beams", "greedy"]

NASTY = ["", " ", "\ud800", "a\udfffb", "\x00", "<script>alert(1)</script>", "x" * 300, "{{ 7*7 }}"]
text = st.sampled_from(NASTY) | st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=20)
scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | text
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
                      max_leaves=8)  # fmt: skip
commands = st.fixed_dictionaries(
    {"command": st.sampled_from(COMMANDS) | values},
    optional={
        **{name: values for name in FIELDS[1:]},
        "content": text,
        "text": text,
        "overrides": st.dictionaries(st.sampled_from(SETTINGS) | text, values, max_size=3),
        "max_new_tokens": st.integers(1, 4),
    },
)
# Valid but for one field: these reach the command logic (and the database) most often.
near_valid = st.builds(
    lambda name, body, extra: {"command": name, "content": body, "text": body, "max_new_tokens": 1, **extra},
    st.sampled_from(["generate", "complete"]),
    text,
    st.dictionaries(st.sampled_from(FIELDS[1:]), values, max_size=1),
)
raw_frames = (
    commands.map(lambda c: json.dumps(c, ensure_ascii=True))
    | near_valid.map(lambda c: json.dumps(c, ensure_ascii=True))
    | values.map(lambda v: json.dumps(v))
    | st.text(alphabet=string.printable + '{}[]":,\\', max_size=40)
    | st.integers(1, 3000).map(lambda depth: '{"command": ' + "[" * depth + "]" * depth + "}")
)


@hypothesis_settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(raw=raw_frames)
def test_fuzz_every_frame_gets_a_documented_answer_and_the_socket_stays_usable(
    session_key: str, queued_ids: list[int], raw: str
) -> None:
    async_to_sync(_one_frame)(session_key, raw)


async def _one_frame(session_key: str, raw: str) -> None:
    socket = connect(session_key)
    assert (await socket.connect(timeout=TIMEOUT_S))[0]
    try:
        await socket.send_input({"type": "websocket.receive", "text": raw})  # send_to refuses ""
        answer = await socket.receive_json_from(timeout=TIMEOUT_S)
        if answer["type"] == "error":
            assert answer["code"] in protocol.ERROR_CODES and answer["code"] != "internal_error", answer
            assert answer["message"]
        else:  # a valid command: queued (or, for stop, its generation's end)
            assert answer["type"] in ("generation.queued", "generation.finished"), answer
        # The socket is still usable: the next valid request succeeds (another session's slots
        # may be taken by what the fuzz queued, so clear them first).
        await sync_to_async(Generation.objects.update)(status="cancelled")
        queued = await command(socket, "complete", request_id="r-ok", text="hello", overrides={"max_new_tokens": 1})
        assert (queued["type"], queued["request_id"]) == ("generation.queued", "r-ok"), queued
    finally:
        await socket.disconnect()
