"""The OpenAI-compatible API over the in-memory channel layer, with an eager worker running
the real runner on a fake engine: shapes, streaming framing, logprobs, reasoning split,
refusals (OpenAI's error shape naming the field), keys, and the cancel of a stream whose
client went away."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.utils import timezone

from playground import protocol, tasks
from playground.coord import cancel, liveness, store
from playground.models import ApiKey, Conversation, Generation
from playground.web.openai_api import follow
from playground.worker import generation
from playground.worker.publisher import send_to_group

from .fake_engine import FakeEngine

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

MODEL = "SmolLM2-135M-Instruct (bundled)"


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """An eager worker: the enqueued task runs the real runner on this fake engine at once."""
    fake = FakeEngine("Hi you")
    monkeypatch.setattr(
        tasks.run_generation,
        "apply_async",
        lambda args, **options: generation.run_generation(args[0], "eager", load_engine=lambda model: fake),
    )
    return fake


async def post(path: str, body: dict[str, Any], **headers: str) -> Any:
    return await AsyncClient().post(path, json.dumps(body), content_type="application/json", headers=headers)


def events_of(raw: bytes) -> list[Any]:
    """The `data:` payloads of a server-sent event stream, checking the framing on the way."""
    assert raw.endswith(b"\n\n")
    frames = raw.decode().split("\n\n")[:-1]
    assert all(frame.startswith("data: ") and "\n" not in frame for frame in frames), frames
    return [frame[len("data: ") :] if frame == "data: [DONE]" else json.loads(frame[6:]) for frame in frames]


async def stream_body(response: Any) -> bytes:
    return b"".join([part async for part in response.streaming_content])


async def test_models_lists_the_enabled_models() -> None:
    response = await AsyncClient().get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["id"] for m in body["data"]] == ["Qwen2.5-Coder-0.5B-Instruct (bundled)", MODEL]  # both bundled
    assert body["data"][0]["object"] == "model"


async def test_chat_completion_answers_in_openai_shape(engine: FakeEngine) -> None:
    response = await post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hi you", "refusal": None}
    assert (choice["finish_reason"], choice["logprobs"]) == ("length", None)
    assert body["usage"]["completion_tokens"] == 6
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    # The worker rendered the request's messages, and the answer is on record like a chat's.
    assert engine.rendered[-1][0] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    row = await sync_to_async(Generation.objects.get)(pk=int(body["id"].split("-")[1]))
    assert (row.session_key, row.status, row.text) == ("api-local", "finished", "Hi you")


async def test_logprobs_come_from_the_step_records(engine: FakeEngine) -> None:
    response = await post(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "logprobs": True,
            "top_logprobs": 2,
            "raw_logprobs": True,
            "timings": True,
        },
    )
    body = response.json()
    content = body["choices"][0]["logprobs"]["content"]
    assert [t["token"] for t in content] == list("Hi you")
    first = content[0]
    assert (first["logprob"], first["bytes"]) == (0.0, [ord("H")])
    # The second alternative was filtered out (-inf): OpenAI's stand-in value.
    assert first["top_logprobs"] == [
        {"token": "H", "logprob": 0.0, "bytes": [72]},
        {"token": "\x01", "logprob": -9999.0, "bytes": [1]},
    ]
    assert (first["raw_logprob"], first["rank"], first["entropy"]) == (-0.1, 1, 0.2)
    assert body["timings"]["predicted_n"] == 6 and body["timings"]["queue_ms"] >= 0


async def test_reasoning_goes_to_reasoning_content_with_its_logprobs_apart(engine: FakeEngine) -> None:
    engine.answer = "<think>hmm</think>\n\nYes."
    response = await post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "?"}], "logprobs": True, "max_tokens": 100},
    )
    choice = response.json()["choices"][0]
    assert (choice["message"]["reasoning_content"], choice["message"]["content"]) == ("hmm", "Yes.")
    assert "".join(t["token"] for t in choice["logprobs"]["reasoning_content"]) == "<think>hmm</think>"
    assert "".join(t["token"] for t in choice["logprobs"]["content"]) == "\n\nYes."
    assert response.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == len("<think>hmm</think>")


async def test_max_thinking_tokens_reaches_the_engine(engine: FakeEngine) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_thinking_tokens": 5}
    response = await post("/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    generation = await sync_to_async(Generation.objects.get)()
    assert generation.params["max_thinking_tokens"] == 5


async def test_a_stream_is_framed_as_openai_chunks(engine: FakeEngine) -> None:
    response = await post(
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "logprobs": True,
        },
    )
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    events = events_of(await stream_body(response))
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content_chunks = [c for c in chunks[1:] if c["choices"]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in content_chunks) == "Hi you"
    assert [c["choices"][0]["finish_reason"] for c in content_chunks][-1] == "length"
    assert content_chunks[-1]["choices"][0]["delta"].get("content")  # the reason rides on a content chunk
    assert all(c["choices"][0]["finish_reason"] is None for c in content_chunks[:-1])
    tokens = [t["token"] for c in content_chunks for t in c["choices"][0]["logprobs"]["content"]]
    assert "".join(tokens) == "Hi you"
    usage_chunk = chunks[-1]
    assert (usage_chunk["choices"], usage_chunk["usage"]["completion_tokens"]) == ([], 6)


async def test_legacy_completion_with_echo_and_logprobs(engine: FakeEngine) -> None:
    response = await post("/v1/completions", {"model": MODEL, "prompt": "Say:", "echo": True, "max_tokens": 3})
    body = response.json()
    assert (body["object"], body["choices"][0]["text"]) == ("text_completion", "Say:Hi ")
    assert engine.prompt_ids == [ord(c) for c in "Say:"]  # raw text, no chat template
    response = await post("/v1/completions", {"model": MODEL, "prompt": [83, 97], "logprobs": 1, "max_tokens": 2})
    logprobs = response.json()["choices"][0]["logprobs"]
    assert logprobs == {
        "tokens": ["H", "i"],
        "token_logprobs": [0.0, 0.0],
        "top_logprobs": [{"H": 0.0}, {"i": 0.0}],
        "text_offset": [0, 1],
    }
    assert engine.prompt_ids == [83, 97]


@pytest.mark.parametrize(
    "body, status, param, code",
    [
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "model", "missing_required_parameter"),
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "model", "model_not_found"),
        ({"model": MODEL, "messages": []}, 400, "messages", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3}, 400, "temperature", None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400, "top_p", None),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
            400,
            "max_tokens",
            None,
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n", None),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3},
            400,
            "top_logprobs",
            None,
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            400,
            "top_logprobs",
            None,
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "presence_penalty": 1},
            400,
            "presence_penalty",
            None,
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "bogus": 1},
            400,
            "bogus",
            "unknown_parameter",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "preset": "nope"}, 404, "preset", None),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_thinking_tokens": -1},
            400,
            "max_thinking_tokens",
            None,
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream_options": {}},
            400,
            "stream_options",
            None,
        ),
    ],
)
async def test_bad_requests_get_openai_errors_naming_the_field(
    engine: FakeEngine, body: dict[str, Any], status: int, param: str, code: str | None
) -> None:
    response = await post("/v1/chat/completions", body)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"] == "invalid_request_error"
    if code is not None:
        assert error["code"] == code
    assert not await sync_to_async(Generation.objects.exists)()  # a refusal writes nothing


async def test_echo_with_logprobs_streamed_and_max_tokens_0_without_echo_are_refused_clearly(
    engine: FakeEngine,
) -> None:
    body = {"model": MODEL, "prompt": "x", "echo": True, "logprobs": 1, "stream": True}
    response = await post("/v1/completions", body)
    assert (response.status_code, response.json()["error"]["param"]) == (400, "echo")
    response = await post("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "max_tokens")


async def test_bad_json_and_wrong_method() -> None:
    response = await AsyncClient().post("/v1/chat/completions", "{nope", content_type="application/json")
    assert (response.status_code, response.json()["error"]["code"]) == (400, "bad_json")
    response = await AsyncClient().get("/v1/chat/completions")
    assert response.status_code == 405


async def test_a_prompt_the_worker_refuses_is_an_http_error(engine: FakeEngine) -> None:
    engine.max_context = 4
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "long"}]})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "prompt_too_long"


async def test_keys_authenticate_and_limit_concurrency(settings: Any, engine: FakeEngine) -> None:
    settings.PLAYGROUND_API_KEYLESS_LOCALHOST = False
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    response = await post("/v1/chat/completions", body)
    assert (response.status_code, response.json()["error"]["code"]) == (401, "invalid_api_key")
    response = await post("/v1/chat/completions", body, Authorization="Bearer pg-wrong")
    assert response.status_code == 401
    key = ApiKey(name="ci", max_concurrent=1)
    secret = key.set_new_key()
    await sync_to_async(key.save)()
    assert key.key_hash != secret and secret not in key.key_hash  # hashed at rest
    response = await post("/v1/chat/completions", body, Authorization=f"Bearer {secret}")
    assert response.status_code == 200
    assert (await sync_to_async(Generation.objects.get)()).session_key == key.client_name
    # One generation already active for this key: the next one is refused with 429.
    await sync_to_async(Generation.objects.update)(status="running", started_at=timezone.now())
    response = await post("/v1/chat/completions", body, Authorization=f"Bearer {secret}")
    assert (response.status_code, response.json()["error"]["code"]) == (429, "too_many_generations")
    key.is_active = False  # revoked
    await sync_to_async(key.save)()
    response = await post("/v1/chat/completions", body, Authorization=f"Bearer {secret}")
    assert response.status_code == 401


async def test_keyless_localhost_ignores_a_placeholder_key(engine: FakeEngine) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    assert (await post("/v1/chat/completions", body, Authorization="Bearer none")).status_code == 200
    assert (await post("/v1/chat/completions", body, Authorization="Bearer pg-wrong")).status_code == 401


async def test_a_client_that_leaves_mid_stream_cancels_its_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    queued = await _started_elsewhere(monkeypatch, started_at=timezone.now())
    response = await post(
        "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    )
    generation_id = queued[0]
    store.client().set(liveness.generation_key(generation_id), 1, px=60_000)  # its worker is alive
    first_chunk = asyncio.Event()

    async def consume() -> None:
        async for _part in response.streaming_content:
            first_chunk.set()

    # Django cancels the task that streams the response when the client disconnects.
    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_chunk.wait(), 5)
    await asyncio.sleep(0.1)  # waiting for the next event
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await sync_to_async(cancel.is_cancel_requested)(generation_id)


async def _started_elsewhere(monkeypatch: pytest.MonkeyPatch, started_at: Any) -> list[int]:
    """The enqueue makes the row running (since `started_at`) and sends its started event, like a worker."""
    monkeypatch.setattr(follow, "WATCH_INTERVAL_S", 0.05)
    queued: list[int] = []

    def start_it(args: tuple[int], **options: Any) -> None:
        Generation.objects.filter(pk=args[0]).update(status="running", started_at=started_at)
        send_to_group(protocol.generation_started(args[0], "w", {}, {}, protocol.prompt_record("p", [], [])))
        queued.append(args[0])

    monkeypatch.setattr(tasks.run_generation, "apply_async", start_it)
    return queued


async def test_a_dead_worker_ends_the_stream_with_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    await _started_elsewhere(monkeypatch, started_at=timezone.now() - timedelta(minutes=1))  # no heartbeat since
    response = await post(
        "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    )
    events = events_of(await stream_body(response))
    assert events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == "worker_lost"
    assert await sync_to_async(Conversation.objects.count)() == 1
