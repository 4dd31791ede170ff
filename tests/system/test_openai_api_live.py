"""The OpenAI-compatible API end to end, driven by the official `openai` client against the
real ASGI server (daphne) and a real Celery worker running the bundled model: chat with and
without streaming, logprobs equal to the WebSocket path's step records for the same seed,
usage with cached tokens on a second turn, legacy completions with echo, stop strings, bad
values, a bad key, a disconnect that frees the worker, and the raw SSE wire framing; then the
API as people's tools call it (issue 27): 8 concurrent async streams, an empty key, `n`, a
batch of prompts scored as single requests, a key's turns, 429 with Retry-After; and a prediction
(Predicted Outputs, issue 51) that keeps the greedy answer the same."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import json
import threading
import time
import urllib.request
from urllib.parse import urlparse

import openai
import pytest

from tests.conftest import django_shell, query_stack_db

from .wsclient import BrowserTab, ends_request, receive_until, send, steps_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MODEL = "SmolLM2-135M-Instruct (bundled)"
QUESTION = [{"role": "user", "content": "Name one colour."}]


@pytest.fixture
def client(live_stack) -> openai.OpenAI:
    live_stack.ensure_worker()
    # Keyless on localhost: the client insists on some key; one without our "pg-" prefix is ignored.
    return openai.OpenAI(base_url=live_stack.base_url + "/v1", api_key="none", timeout=180, max_retries=0)


def run_apart(main):
    """`asyncio.run(main())` on a thread of its own: the clients' loop must not depend on whether
    an earlier test left an event loop running on the test runner's thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(main())).result()


def generation_status(live_stack, generation_id: int) -> str:
    [(status,)] = query_stack_db(
        live_stack.env, "select status from playground_generation where id = %s", (generation_id,)
    )
    return status


def test_models_and_a_chat_completion(client: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in client.models.list()]
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    assert completion.usage.completion_tokens <= 8 and completion.usage.prompt_tokens > 5


def test_logprobs_equal_the_websocket_step_records_for_the_same_seed(client: openai.OpenAI, live_stack) -> None:
    # top_p=1: no token filtered out, so the sampled-from distribution has all 20 alternatives.
    sampling = {"temperature": 0.8, "top_p": 1.0, "seed": 1234, "max_tokens": 8}
    completion = client.chat.completions.create(
        model=MODEL, messages=QUESTION, logprobs=True, top_logprobs=20, extra_body={"ignore_eos": True}, **sampling
    )
    tab = BrowserTab(live_stack.base_url, live_stack.ws_url)
    tab.get("/")
    overrides = {
        "temperature": 0.8,
        "top_p": 1.0,
        "seed": 1234,
        "max_new_tokens": 8,
        "ignore_eos": True,
        "num_alternatives": 20,
    }
    with tab.connect() as ws:
        send(ws, "generate", content=QUESTION[0]["content"], overrides=overrides)
        events = receive_until(ws, ends_request)
        steps = steps_of(events)
    started = next(e for e in events if e["type"] == "generation.started")
    assert started["model"]["name"] == MODEL  # the record's name, not the file's
    tokens = completion.choices[0].logprobs.content
    assert [t.token for t in tokens] == [s["piece"] for s in steps]
    assert [t.bytes for t in tokens] == [list(bytes.fromhex(s["token_bytes"])) for s in steps]
    for token, step in zip(tokens, steps, strict=True):
        assert token.logprob == pytest.approx(step["logprob"], abs=1e-3)
        assert len(token.top_logprobs) == 20
        assert [a.token for a in token.top_logprobs] == [a["piece"] for a in step["top_processed"]]
        assert [a.logprob for a in token.top_logprobs] == pytest.approx(
            [a["logprob"] for a in step["top_processed"]], abs=1e-3
        )
    # The whole answer as the stream gives it: leading whitespace dropped, the rest as generated.
    assert completion.choices[0].message.content == "".join(s["text_delta"] for s in steps).lstrip()


def test_streaming_with_usage_reports_cached_tokens_on_the_second_turn(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0)
    history = [*QUESTION, {"role": "assistant", "content": first.choices[0].message.content}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[*history, {"role": "user", "content": "And another one?"}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices]
    assert content[-1].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 6
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # the first turn's prefix was reused
    assert "".join(c.choices[0].delta.content or "" for c in content)


def test_legacy_completion_with_echo_and_a_stop_string(client: openai.OpenAI) -> None:
    prompt = "The capital of France is"
    completion = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, echo=True)
    assert completion.choices[0].text.startswith(prompt) and len(completion.choices[0].text) > len(prompt)
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, logprobs=3)
    text = plain.choices[0].text
    assert len(plain.choices[0].logprobs.tokens) == plain.usage.completion_tokens
    stop = text.strip()[:2]  # something the greedy answer surely contains
    stopped = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stop=[stop])
    assert stop not in stopped.choices[0].text and stopped.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=MODEL, prompt=prompt, echo=True, logprobs=1, stream=True)
    assert refused.value.body["param"] == "echo"


def test_echo_with_logprobs_scores_the_prompt_as_the_model_does(client: openai.OpenAI) -> None:
    """What evaluation tools send to score a text (max_tokens=0, echo, logprobs): every prompt
    token's logprob after the ones before it, equal to the model's own, computed here alone."""
    import torch

    from inference import EngineConfig
    from inference.engine import Engine

    prompt = "The capital of France is Paris"
    scored = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, echo=True, logprobs=2)
    choice = scored.choices[0]
    assert choice.text == prompt and scored.usage.completion_tokens == 0
    lp = choice.logprobs
    engine = Engine.load(EngineConfig(source="bundled", device="cpu", dtype="float32"))
    ids = engine.prompts.encode(prompt)
    with torch.inference_mode():
        expected = torch.log_softmax(engine.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    assert lp.tokens == [engine.prompts.piece(i) for i in ids] and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx([float(expected[i, t]) for i, t in enumerate(ids[1:])], abs=1e-3)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert prompt[lp.text_offset[-1] :] == engine.prompts.piece(ids[-1]).replace("Ġ", " ")
    assert all(len(top) == 2 for top in lp.top_logprobs[1:])
    answered = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=1)
    assert len(answered.choices[0].logprobs.tokens) == len(ids) + answered.usage.completion_tokens


def test_bad_values_and_a_bad_key_are_refused(client: openai.OpenAI, live_stack) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=QUESTION, temperature=5)
    assert refused.value.status_code == 400 and refused.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nothing", messages=QUESTION)
    bad = openai.OpenAI(base_url=live_stack.base_url + "/v1", api_key="pg-not-a-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=QUESTION)


def test_a_client_that_disconnects_mid_stream_frees_the_worker(client: openai.OpenAI, live_stack) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
    )
    chunks = [next(stream) for _ in range(4)]
    generation_id = int(chunks[0].id.split("-")[1])
    stream.close()
    deadline = time.monotonic() + 30
    while generation_status(live_stack, generation_id) != "cancelled":
        assert time.monotonic() < deadline, "the generation went on after its client left"
        time.sleep(0.2)
    # The worker is free for the next request.
    completion = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0)
    assert completion.choices[0].message.content


def test_the_raw_event_stream_framing(live_stack) -> None:
    live_stack.ensure_worker()
    url = urlparse(live_stack.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=180)
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "temperature": 0, "stream": True}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/event-stream"
    assert response.getheader("Cache-Control") == "no-cache"
    raw = response.read().decode()
    connection.close()
    assert raw.endswith("data: [DONE]\n\n")
    frames = raw.split("\n\n")[:-1]
    assert all(frame.startswith("data: ") and "\n" not in frame for frame in frames), raw
    chunks = [json.loads(frame[6:]) for frame in frames[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


# ---- the API as people's tools call it (issue 27) -------------------------------------------


def make_key(live_stack, max_concurrent: int) -> tuple[str, str]:
    """(the owner its generations are filed under, the secret key)."""
    code = (
        "from playground.models import ApiKey; from playground.web import owners; "
        f"key = ApiKey(name='live-{max_concurrent}', max_concurrent={max_concurrent}); "
        "secret = key.set_new_key(); key.save(); print(owners.api_key_owner(key.pk), secret)"
    )
    owner, secret = django_shell(code, live_stack.env).split()
    return owner, secret


def statuses_of(live_stack, owner: str) -> list[str]:
    rows = query_stack_db(live_stack.env, "select status from playground_generation where owner = %s", (owner,))
    return [row[0] for row in rows]


def test_eight_concurrent_keyless_async_streams_all_finish(live_stack) -> None:
    """What AsyncOpenAI, langchain's .batch() and evaluation harnesses do; with no retries, so a
    refusal would fail the test. Each stream's timings are the rate that stream got."""
    live_stack.ensure_worker()

    async def one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, dict, float]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True, "timings": True},
        )
        text, reason, timings, token_times = "", None, {}, []
        async for chunk in stream:
            if chunk.choices:
                if chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
                    token_times.append(time.monotonic())
                reason = chunk.choices[0].finish_reason or reason
            elif chunk.model_extra.get("timings"):
                timings = chunk.model_extra["timings"]
        return text, reason, timings, (token_times[-1] - token_times[0]) * 1000

    async def main() -> list[tuple[str, str | None, dict, float]]:
        client = openai.AsyncOpenAI(base_url=live_stack.base_url + "/v1", api_key="none", timeout=300, max_retries=0)
        try:
            return await asyncio.gather(*(one(client, i) for i in range(8)))
        finally:
            await client.close()

    results = run_apart(main)
    assert all(text and reason == "length" for text, reason, _, _ in results), results
    for _, _, timings, seen_ms in results:
        assert timings["queue_ms"] is not None and timings["predicted_n"] == 24
        # Measured on the worker from the stream's first token to its last; the client saw the
        # same span give or take the publisher's coalescing and the network.
        assert abs(timings["predicted_ms"] - seen_ms) < 0.3 * seen_ms + 500, (timings, seen_ms)
        assert timings["predicted_per_second"] == pytest.approx(23 / timings["predicted_ms"] * 1000, rel=1e-6)


def test_an_empty_bearer_works_on_keyless_localhost(live_stack) -> None:
    live_stack.ensure_worker()
    url = urlparse(live_stack.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=180)
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "temperature": 0}
    headers = {"Content-Type": "application/json", "Authorization": "Bearer "}
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = connection.getresponse()
    assert response.status == 200, response.read()
    assert json.loads(response.read())["choices"][0]["message"]["content"]
    connection.close()


def test_n_choices_each_sampled_with_the_prompt_counted_once(client: openai.OpenAI) -> None:
    single = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0)
    sampling = {"max_tokens": 8, "temperature": 1.0, "seed": 11, "extra_body": {"ignore_eos": True}}
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, n=3, **sampling)
    assert [c.index for c in answer.choices] == [0, 1, 2]
    assert all(c.message.content and c.finish_reason == "length" for c in answer.choices)
    assert len({c.message.content for c in answer.choices}) > 1  # seeds 11, 12, 13: their own sequences
    assert answer.usage.prompt_tokens == single.usage.prompt_tokens  # counted once, as OpenAI does
    assert answer.usage.completion_tokens == 3 * 8
    again = client.chat.completions.create(model=MODEL, messages=QUESTION, n=3, stream=True, **sampling)
    texts = ["", "", ""]
    for chunk in again:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in answer.choices]  # seeded: the same, streamed or not


def test_a_batch_of_16_prompts_is_scored_as_16_single_requests(client: openai.OpenAI) -> None:
    """What an evaluation harness sends for log-likelihoods: echo, logprobs, max_tokens 0."""
    prompts = [
        f"The {word} is" for word in "sky sea sun moon tree road cat dog car bird rain snow fire ice gold salt".split()
    ]
    scoring = {"max_tokens": 0, "echo": True, "logprobs": 1}
    batch = client.completions.create(model=MODEL, prompt=prompts, **scoring)
    singles = [client.completions.create(model=MODEL, prompt=prompt, **scoring) for prompt in prompts]
    assert [c.index for c in batch.choices] == list(range(16))
    for choice, single in zip(batch.choices, singles, strict=True):
        expected = single.choices[0]
        assert choice.text == expected.text and choice.logprobs.tokens == expected.logprobs.tokens
        assert choice.logprobs.token_logprobs[0] is None
        assert choice.logprobs.token_logprobs[1:] == pytest.approx(expected.logprobs.token_logprobs[1:], abs=1e-4)
    assert batch.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert batch.usage.completion_tokens == 0


def test_a_key_beyond_its_concurrency_waits_for_its_turn(live_stack) -> None:
    """Six requests at once on a key that runs two at a time: all finish, never more than two run."""
    live_stack.ensure_worker()
    owner, secret = make_key(live_stack, max_concurrent=2)
    num_running: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            num_running.append(statuses_of(live_stack, owner).count("running"))
            time.sleep(0.05)

    async def main() -> list[str]:
        client = openai.AsyncOpenAI(base_url=live_stack.base_url + "/v1", api_key=secret, timeout=300, max_retries=0)
        try:
            answers = await asyncio.gather(
                *(
                    client.completions.create(
                        model=MODEL, prompt=f"{i} apples and", max_tokens=12, extra_body={"ignore_eos": True}
                    )
                    for i in range(6)
                )
            )
            return [a.choices[0].text for a in answers]
        finally:
            await client.close()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        texts = run_apart(main)
    finally:
        done.set()
        watcher.join()
    assert len(texts) == 6 and all(texts)
    assert max(num_running) == 2 and statuses_of(live_stack, owner) == ["finished"] * 6


def test_a_full_backlog_is_429_with_retry_after_and_its_reason_phrase(live_stack) -> None:
    live_stack.ensure_worker()
    owner, secret = make_key(live_stack, max_concurrent=1)
    url = urlparse(live_stack.base_url)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {secret}"}
    # One request fills the key's backlog: 1 running (a long one) + PLAYGROUND_API_MAX_WAITING (64) waiting.
    filling = http.client.HTTPConnection(url.hostname, url.port, timeout=180)
    body = {"model": MODEL, "prompt": [f"{i} and" for i in range(65)], "max_tokens": 2000, "ignore_eos": True}
    filling.request("POST", "/v1/completions", json.dumps(body), headers)
    deadline = time.monotonic() + 60
    while len(statuses_of(live_stack, owner)) < 65:
        assert time.monotonic() < deadline, "the rows were not made"
        time.sleep(0.2)
    refused = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    refused.request("POST", "/v1/completions", json.dumps({**body, "prompt": "x", "max_tokens": 1}), headers)
    response = refused.getresponse()
    assert (response.status, response.reason) == (429, "Too Many Requests")
    assert response.getheader("Retry-After") == "1"
    assert json.loads(response.read())["error"]["code"] == "too_many_generations"
    refused.close()
    filling.close()  # the client leaves: its generations are cancelled, running or waiting
    deadline = time.monotonic() + 30
    while {"queued", "running"} & set(statuses_of(live_stack, owner)):
        assert time.monotonic() < deadline, "the generations of a client that left went on"
        time.sleep(0.2)


def test_metrics_are_labelled_with_the_record_name(client: openai.OpenAI, live_stack) -> None:
    client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=2, temperature=0)
    time.sleep(1.5)  # the worker writes its snapshot about once a second
    with urllib.request.urlopen(live_stack.base_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    assert f'model="{MODEL}"' in text and 'model="SmolLM2-135M-Instruct"' not in text


CODE = "def area(width, height):\n    return width * height\n"


def test_a_prediction_of_the_code_to_edit_keeps_the_answer_and_is_partly_accepted(client: openai.OpenAI) -> None:
    """Predicted Outputs (issue 51) on the real engine: greedy, the answer is the one without the
    prediction, token for token; verifying the original code's tokens, the model keeps some."""
    ask = f"Rename the function to rectangle_area. Reply with the code only.\n\n```python\n{CODE}```"
    settings = {"model": MODEL, "messages": [{"role": "user", "content": ask}], "max_tokens": 60, "temperature": 0}
    plain = client.chat.completions.create(**settings)
    predicted = client.chat.completions.create(**settings, prediction={"type": "content", "content": CODE})
    assert predicted.choices[0].message.content == plain.choices[0].message.content
    assert predicted.usage.completion_tokens == plain.usage.completion_tokens
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0, (plain.choices[0].message.content, details)
    assert details.rejected_prediction_tokens >= 0
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens is None  # no prediction, no count
