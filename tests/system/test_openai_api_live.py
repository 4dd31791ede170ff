"""The OpenAI-compatible API end to end, driven by the official `openai` client against the
real ASGI server (daphne) and a real Celery worker running the bundled model: chat with and
without streaming, logprobs equal to the WebSocket path's step records for the same seed,
usage with cached tokens on a second turn, legacy completions with echo, stop strings, bad
values, a bad key, a disconnect that frees the worker, and the raw SSE wire framing."""

from __future__ import annotations

import http.client
import json
import sqlite3
import time
from urllib.parse import urlparse

import openai
import pytest

from .wsclient import BrowserTab, ends_request, receive_until, send, steps_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

MODEL = "SmolLM2-135M-Instruct (bundled)"
QUESTION = [{"role": "user", "content": "Name one colour."}]


@pytest.fixture
def client(live_stack) -> openai.OpenAI:
    live_stack.ensure_worker()
    # Keyless on localhost: the client insists on some key; one without our "pg-" prefix is ignored.
    return openai.OpenAI(base_url=live_stack.base_url + "/v1", api_key="none", timeout=180, max_retries=0)


def generation_status(live_stack, generation_id: int) -> str:
    path = live_stack.env["DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        return db.execute("select status from playground_generation where id = ?", (generation_id,)).fetchone()[0]


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
        steps = steps_of(receive_until(ws, ends_request))
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
    assert completion.choices[0].message.content == "".join(s["text_delta"] for s in steps).strip()


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
