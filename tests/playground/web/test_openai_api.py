"""The OpenAI-compatible API over the in-memory channel layer, with an eager worker running
the real runner on a fake engine: shapes, streaming framing, logprobs, reasoning split,
refusals (OpenAI's error shape naming the field), keys, and the cancel of a stream whose
client went away."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.test import AsyncClient
from django.utils import timezone

from playground import protocol
from playground.coord import cancel, keys, liveness, store
from playground.models import ApiKey, Conversation, Generation
from playground.web import following, owners
from playground.web.openai_api import run, turns
from playground.worker.publisher import send_to_group
from tests.playground.fake_engine import FakeEngine
from tests.playground.sent_tasks import on_task
from tests.playground.web.api_calls import events_of, post, stream_body

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

MODEL = "SmolLM2-135M-Instruct (bundled)"


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
    assert (row.owner, row.status, row.text) == ("api:local", "finished", "Hi you")


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


@pytest.mark.parametrize("penalize_prompt", [True, False])
async def test_penalize_prompt_reaches_the_engine(engine: FakeEngine, penalize_prompt: bool) -> None:
    body = {"model": MODEL, "prompt": "x", "repetition_penalty": 1.2, "penalize_prompt": penalize_prompt}
    response = await post("/v1/completions", body)
    assert response.status_code == 200, response.content
    generation = await sync_to_async(Generation.objects.get)()
    assert (generation.params["repetition_penalty"], generation.params["penalize_prompt"]) == (1.2, penalize_prompt)


async def test_the_prefix_cache_can_be_turned_off_per_request(engine: FakeEngine) -> None:
    """A benchmark or a lesson compares prefills of the whole prompt, as the chat page's switch does."""
    response = await post("/v1/completions", {"model": MODEL, "prompt": "x", "use_prefix_cache": False})
    assert response.status_code == 200, response.content
    generation = await sync_to_async(Generation.objects.get)()
    assert generation.params["use_prefix_cache"] is False
    refused = await post("/v1/completions", {"model": MODEL, "prompt": "x", "use_prefix_cache": "off"})
    assert refused.status_code == 400 and "use_prefix_cache" in refused.json()["error"]["message"]


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
        ({"model": MODEL, "messages": [{"role": "fn", "content": "x"}]}, 400, "messages[0].role", "invalid_value"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3}, 400, "temperature", None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400, "top_p", None),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
            400,
            "max_tokens",
            None,
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n", None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 17}, 400, "n", None),
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
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "penalize_prompt": "no"},
            400,
            "penalize_prompt",
            None,
        ),
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


async def test_a_chat_of_more_messages_than_the_limit_is_refused_before_anything_is_written(
    engine: FakeEngine, settings: Any
) -> None:
    """10,000 one-letter messages are within the character limit but render to 60,000 tokens:
    the web process refuses them by count, in milliseconds, and no worker sees them (issue 46)."""
    messages = [{"role": "user", "content": "x"}] * 10_000
    started = time.perf_counter()
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 4})
    assert time.perf_counter() - started < 10
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (400, "prompt_too_long", "messages")
    assert "10000" in error["message"] and str(settings.PLAYGROUND_MAX_MESSAGES) in error["message"]
    assert not await sync_to_async(Generation.objects.exists)()
    assert not await sync_to_async(Conversation.objects.exists)()
    assert engine.rendered == []


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
    assert (await sync_to_async(Generation.objects.get)()).owner == owners.api_key_owner(key.pk)
    # One generation already running for this key and no place to wait: 429, with when to retry.
    settings.PLAYGROUND_API_MAX_WAITING = 0
    await sync_to_async(Generation.objects.update)(status="running", started_at=timezone.now())
    response = await post("/v1/chat/completions", body, Authorization=f"Bearer {secret}")
    assert (response.status_code, response.json()["error"]["code"]) == (429, "too_many_generations")
    assert response["Retry-After"] == "1"
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


async def test_the_first_token_goes_out_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A content chunk is held back until the next event (so the finish reason can ride on the
    last one), but never the first: under load the next event comes a coalescing delay later."""
    monkeypatch.setattr(run, "HOLD_CHUNK_S", 30.0)
    queued = await _started_elsewhere(monkeypatch, started_at=timezone.now())
    response = await post(
        "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    )
    store.client().set(liveness.generation_key(queued[0]), 1, px=60_000)  # its worker is alive
    parts = response.streaming_content.__aiter__()
    assert events_of(await asyncio.wait_for(parts.__anext__(), 5))[0]["choices"][0]["delta"]["role"] == "assistant"
    step = '{"index": 0, "token_id": 72, "text_delta": "Hel"}'
    await sync_to_async(send_to_group)(protocol.generation_steps(queued[0], [step], is_beam=False))
    first = events_of(await asyncio.wait_for(parts.__anext__(), 5))[0]
    assert first["choices"][0]["delta"] == {"content": "Hel"}
    await parts.aclose()


async def _started_elsewhere(monkeypatch: pytest.MonkeyPatch, started_at: Any) -> list[int]:
    """The enqueue makes the row running (since `started_at`) and sends its started event, like a worker."""
    monkeypatch.setattr(following, "WATCH_INTERVAL_S", 0.05)
    queued: list[int] = []

    def start_it(args: tuple[int], **options: Any) -> None:
        Generation.objects.filter(pk=args[0]).update(status="running", started_at=started_at)
        send_to_group(protocol.generation_started(args[0], "w", {}, {}, protocol.prompt_record("p", [], [])))
        queued.append(args[0])

    on_task(monkeypatch, "run_generation", apply_async=start_it)
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


# ---- issue 27: the API as people's tools call it ------------------------------------------


async def test_an_empty_bearer_is_no_key(settings: Any, engine: FakeEngine) -> None:
    """Tools send `Authorization: Bearer ` when no key is configured: on keyless localhost that
    is no key; where keys are required it is a missing key."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    assert (await post("/v1/chat/completions", body, Authorization="Bearer ")).status_code == 200
    settings.PLAYGROUND_API_KEYLESS_LOCALHOST = False
    response = await post("/v1/chat/completions", body, Authorization="Bearer ")
    assert response.status_code == 401 and "no API key" in response.json()["error"]["message"]


async def test_n_choices_are_sequences_of_one_prompt_whose_tokens_count_once(engine: FakeEngine) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 3, "seed": 7, "temperature": 0.5}
    response = await post("/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in answer["choices"]] == ["Hi you"] * 3
    rows = await sync_to_async(list)(Generation.objects.order_by("pk"))
    assert [row.params["seed"] for row in rows] == [7, 8, 9]  # each choice its own sequence
    assert len(engine.rendered) == 1  # the prompt was built once, for the three
    assert answer["usage"]["prompt_tokens"] == rows[0].num_prompt_tokens  # counted once, as OpenAI does
    assert answer["usage"]["completion_tokens"] == 18 and answer["id"] == f"chatcmpl-{rows[0].pk}"
    conversation = await sync_to_async(Conversation.objects.get)()
    answers = await sync_to_async(list)(conversation.messages.filter(role="assistant").order_by("pk"))
    assert [m.is_active for m in answers] == [True, False, False] and {m.content for m in answers} == {"Hi you"}

    stream = await post("/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = events_of(await stream_body(stream))[:-1]
    assert [c["choices"][0]["delta"] for c in chunks[:3]] == [{"role": "assistant", "content": ""}] * 3
    by_index: dict[int, str] = {0: "", 1: "", 2: ""}
    for chunk in chunks[3:-1]:
        choice = chunk["choices"][0]
        by_index[choice["index"]] += choice["delta"].get("content", "")
    assert by_index == {0: "Hi you", 1: "Hi you", 2: "Hi you"}
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1, 2]
    assert chunks[-1]["usage"] == answer["usage"]


async def test_a_list_of_prompts_answers_each_in_order_with_usage_summed(engine: FakeEngine) -> None:
    body = {"model": MODEL, "prompt": ["A:", "Be:"], "n": 2, "echo": True, "max_tokens": 2}
    response = await post("/v1/completions", body)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert [(c["index"], c["text"]) for c in answer["choices"]] == [
        (0, "A:Hi"),
        (1, "A:Hi"),
        (2, "Be:Hi"),
        (3, "Be:Hi"),
    ]
    assert answer["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 8,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    response = await post("/v1/completions", {"model": MODEL, "prompt": [[83, 97], "x"], "max_tokens": 1})
    assert [c["text"] for c in response.json()["choices"]] == ["H", "H"]
    stream = await post("/v1/completions", {**body, "stream": True})
    chunks = events_of(await stream_body(stream))[:-1]
    texts = {i: "" for i in range(4)}
    for chunk in chunks:
        texts[chunk["choices"][0]["index"]] += chunk["choices"][0]["text"]
    assert texts == {i: c["text"] for i, c in enumerate(answer["choices"])}


@pytest.mark.parametrize(
    "prompt, param",
    [([], "prompt"), (["ok", ""], "prompt[1]"), (["ok", [1, -2]], "prompt[1]"), ([["x"]], "prompt[0]")],
)
async def test_a_bad_prompt_in_a_list_is_named(engine: FakeEngine, prompt: Any, param: str) -> None:
    response = await post("/v1/completions", {"model": MODEL, "prompt": prompt})
    assert (response.status_code, response.json()["error"]["param"]) == (400, param)


async def test_limits_of_one_request_are_400_naming_the_field(settings: Any, engine: FakeEngine) -> None:
    settings.PLAYGROUND_API_MAX_CONCURRENT, settings.PLAYGROUND_API_MAX_WAITING = 2, 3
    response = await post(
        "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "n": 3}
    )
    assert (response.status_code, response.json()["error"]["param"]) == (400, "n")
    response = await post("/v1/completions", {"model": MODEL, "prompt": ["a", "b", "c"], "n": 2})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "prompt")
    assert not await sync_to_async(Generation.objects.exists)()


async def test_streamed_and_non_streamed_text_are_identical(engine: FakeEngine) -> None:
    engine.answer = " 1, 2, "
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Count"}], "max_tokens": 10}
    whole = (await post("/v1/chat/completions", body)).json()["choices"][0]["message"]["content"]
    chunks = events_of(await stream_body(await post("/v1/chat/completions", {**body, "stream": True})))[:-1]
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert whole == streamed == "1, 2, "


async def test_timings_are_the_rate_the_stream_got(engine: FakeEngine) -> None:
    """The fake engine says 1000 tok/s (its compute time); the stream got a token every 50 ms
    (20 tok/s; the first and last tokens are timed where the worker handles them, so a few ms of
    scheduling around them moves the rate by a few percent either way)."""
    engine.on_step = lambda index: time.sleep(0.05)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "timings": True}
    timings = (await post("/v1/chat/completions", body)).json()["timings"]
    assert 10 < timings["predicted_per_second"] <= 21 and timings["predicted_ms"] >= 5 * 47
    assert timings["queue_ms"] >= 0
    chunks = events_of(await stream_body(await post("/v1/chat/completions", {**body, "stream": True})))
    streamed = chunks[-2]["timings"]
    assert 10 < streamed["predicted_per_second"] <= 21 and streamed["queue_ms"] >= 0


async def test_requests_beyond_the_client_concurrency_wait_for_their_turn(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.PLAYGROUND_API_MAX_CONCURRENT = 1
    queued = await _started_elsewhere(monkeypatch, started_at=timezone.now())
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    first = await post("/v1/chat/completions", body)
    store.client().set(liveness.generation_key(queued[0]), 1, px=60_000)  # its worker is alive
    second = asyncio.create_task(post("/v1/chat/completions", body))
    await asyncio.sleep(0.5)
    # (Not thread-sensitive: the test client runs the waiting request's sync middleware in that thread.)
    rows = Generation.objects.order_by("pk").values_list("status", flat=True)
    statuses = await sync_to_async(list, thread_sensitive=False)(rows)
    assert not second.done() and len(queued) == 1 and statuses == ["running", "queued"]
    # The first one ends (its worker saves the row, then sends the terminal event): the second goes.
    finish = Generation.objects.filter(pk=queued[0]).update
    await sync_to_async(finish, thread_sensitive=False)(status="finished", finished_at=timezone.now())
    await get_channel_layer().group_send(
        protocol.group_name(queued[0]), protocol.generation_finished(queued[0], None, "eos", "", {})
    )
    response = await asyncio.wait_for(second, 5)
    assert response.status_code == 200 and len(queued) == 2
    assert events_of(await stream_body(first))[-1] == "[DONE]"
    task = asyncio.create_task(stream_body(response))  # the client leaves: its generation is cancelled
    await asyncio.sleep(0.1)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def test_a_queued_row_no_web_process_holds_is_cancelled_at_the_next_turn(settings: Any) -> None:
    """A web process that died left its waiting rows queued: the client's next turn cancels them
    (a held one, marked waiting, is kept and keeps its place)."""
    orphan = Generation.objects.create(owner=owners.LOCAL_API_OWNER, params={})
    held = Generation.objects.create(owner=owners.LOCAL_API_OWNER, params={})
    Generation.objects.filter(pk__in=[orphan.pk, held.pk]).update(created_at=timezone.now() - timedelta(minutes=5))
    store.client().set(keys.api_turn(held.pk), "waiting")
    newest = Generation.objects.create(owner=owners.LOCAL_API_OWNER, params={})
    assert not turns.check_turn(owners.LOCAL_API_OWNER, [newest.pk], max_concurrent=1)
    orphan.refresh_from_db()
    assert orphan.status == "cancelled" and store.client().get(keys.api_turn(newest.pk)) == b"waiting"
    assert turns.check_turn(owners.LOCAL_API_OWNER, [newest.pk], max_concurrent=2)
    assert store.client().get(keys.api_turn(newest.pk)) == b"sent"
    assert Generation.objects.get(pk=held.pk).status == "queued"


async def test_a_backlog_full_of_a_dead_processes_rows_is_cleared(settings: Any, engine: FakeEngine) -> None:
    settings.PLAYGROUND_API_MAX_CONCURRENT, settings.PLAYGROUND_API_MAX_WAITING = 1, 1
    for _ in range(2):  # left queued, unmarked, by a web process that died
        await sync_to_async(Generation.objects.create)(owner=owners.LOCAL_API_OWNER, params={})
    await sync_to_async(Generation.objects.update)(created_at=timezone.now() - timedelta(minutes=5))
    store.client().set(keys.worker_alive("w"), 1)  # a worker lives: they are not "lost", only orphaned
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 200, response.content
    rows = await sync_to_async(list)(Generation.objects.order_by("pk").values_list("status", "error_code"))
    # ended by the lost rule (no task was ever sent for them, and no process holds them)
    assert rows == [("error", "service_unavailable")] * 2 + [("finished", "")]


def test_a_generation_waiting_for_its_turn_is_not_lost(settings: Any) -> None:
    """Held by its web process (marked waiting), an API generation's task is not sent for as long
    as it waits; the lost rule leaves it queued however long that is."""
    waiting = Generation.objects.create(owner=owners.LOCAL_API_OWNER, params={})
    Generation.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    store.client().set(keys.worker_alive("w"), 1)
    store.client().set(keys.api_turn(waiting.pk), "waiting")
    assert not liveness.mark_lost_if_stale(Generation.objects.get(pk=waiting.pk))
    store.client().delete(keys.api_turn(waiting.pk))  # its process died: nothing will ever send it
    assert liveness.mark_lost_if_stale(Generation.objects.get(pk=waiting.pk))


async def test_a_full_server_queue_is_503_with_retry_after(settings: Any, engine: FakeEngine) -> None:
    settings.PLAYGROUND_MAX_QUEUED = 1
    await sync_to_async(Generation.objects.create)(owner="someone-else", params={})
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert (response.status_code, response.json()["error"]["code"]) == (503, "server_busy")
    assert response["Retry-After"] == "2"


def test_daphne_writes_a_reason_phrase_for_every_status() -> None:
    from twisted.web import http

    import playground.asgi  # noqa: F401  (completes the table when the application is built)

    assert http.RESPONSES[429] == b"Too Many Requests" and http.RESPONSES[451] == b"Unavailable For Legal Reasons"
