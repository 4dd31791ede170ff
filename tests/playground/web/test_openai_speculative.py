"""Speculative decoding through `/v1` (issue 51): OpenAI's `prediction` (Predicted Outputs) and our
extras `speculative` and `num_speculative_tokens` reach the engine as overrides; `usage` reports
`accepted_prediction_tokens` / `rejected_prediction_tokens` from the worker's `Finished` numbers,
summed over the choices, streamed or not; bad shapes and unknown drafts are 400s naming the field
and write nothing. Over the ASGI app with an eager worker: the fake engine (canned verifications)
for the shapes, and the REAL engine on a tiny random model through the official `openai` client
for the answer itself: the same with a prediction as without."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from asgiref.sync import sync_to_async

from inference.sampling_params import MAX_PREDICTION_CHARS
from playground.models import Generation, LanguageModel
from playground.worker import engines
from tests.inference.engines import tiny_chat_engine
from tests.playground.fake_engine import FakeEngine
from tests.playground.web.api_calls import events_of, post

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

MODEL = "SmolLM2-135M-Instruct (bundled)"
OTHER_MODEL = "Qwen2.5-Coder-0.5B-Instruct (bundled)"  # an enabled record: a draft the web side allows
HI = [{"role": "user", "content": "Hi"}]


# "Hi you" against the prediction "Hi yoU": the fake verifies each decode step's character (1..5):
# "i", " ", "y", "o" accepted, "U" rejected.
PREDICTION = "Hi yoU"


async def test_a_prediction_reaches_the_engine_and_usage_reports_its_tokens(engine: FakeEngine) -> None:
    body = {"model": MODEL, "messages": HI, "prediction": {"type": "content", "content": PREDICTION}}
    response = await post("/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["choices"][0]["message"]["content"] == "Hi you"
    details = answer["usage"]["completion_tokens_details"]
    assert details == {"reasoning_tokens": 0, "accepted_prediction_tokens": 4, "rejected_prediction_tokens": 1}
    row = await sync_to_async(Generation.objects.get)()
    assert row.params["prediction"] == PREDICTION
    # The Finished record's numbers are the saved stats, under the engine's names.
    stats = {k: row.stats[k] for k in ("num_proposed_tokens", "num_accepted_tokens", "speculative_speedup")}
    assert stats == {"num_proposed_tokens": 5, "num_accepted_tokens": 4, "speculative_speedup": 1.5}


async def test_a_prediction_as_text_parts_is_their_text_joined(engine: FakeEngine) -> None:
    parts = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "yoU"}]
    body = {"model": MODEL, "prompt": "x", "prediction": {"type": "content", "content": parts}}
    response = await post("/v1/completions", body)  # the legacy endpoint takes it too
    assert response.status_code == 200, response.content
    assert response.json()["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 4
    assert (await sync_to_async(Generation.objects.get)()).params["prediction"] == PREDICTION


async def test_usage_has_no_prediction_numbers_without_a_prediction(engine: FakeEngine) -> None:
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": HI, "speculative": "prompt_lookup"})
    assert response.status_code == 200, response.content
    assert response.json()["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    row = await sync_to_async(Generation.objects.get)()
    assert (row.params["speculative"], row.params["prediction"]) == ("prompt_lookup", None)
    assert (row.stats["num_proposed_tokens"], row.stats["num_accepted_tokens"]) == (5, 5)


async def test_streamed_usage_sums_the_prediction_tokens_over_the_choices(engine: FakeEngine) -> None:
    body = {
        "model": MODEL,
        "messages": HI,
        "n": 2,
        "temperature": 1,
        "prediction": {"type": "content", "content": PREDICTION},
        "num_speculative_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = await post("/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    events = events_of(b"".join([part async for part in response.streaming_content]))
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["completion_tokens_details"]["accepted_prediction_tokens"] == 8
    assert usage["completion_tokens_details"]["rejected_prediction_tokens"] == 2
    rows = await sync_to_async(list)(Generation.objects.all())
    assert [row.params["num_speculative_tokens"] for row in rows] == [3, 3]


@pytest.mark.parametrize(
    "extra, param, code",
    [
        ({"prediction": "Hi you"}, "prediction", "invalid_type"),
        ({"prediction": {"type": "text", "content": "x"}}, "prediction.type", "unsupported_parameter"),
        ({"prediction": {"content": "x"}}, "prediction.type", "invalid_value"),
        ({"prediction": {"type": "content"}}, "prediction.content", "invalid_value"),
        ({"prediction": {"type": "content", "content": 5}}, "prediction.content", "invalid_value"),
        ({"prediction": {"type": "content", "content": [{"type": "image_url"}]}}, "prediction.content[0]", None),
        ({"prediction": {"type": "content", "content": ["x"]}}, "prediction.content[0]", None),
        ({"prediction": {"type": "content", "content": "x", "extra": 1}}, "prediction.extra", None),
        (
            {"prediction": {"type": "content", "content": "x" * (MAX_PREDICTION_CHARS + 1)}},
            "prediction.content",
            None,
        ),
        ({"speculative": 3}, "speculative", "invalid_type"),
        ({"speculative": " "}, "speculative", "invalid_value"),
        ({"speculative": "no-such-draft"}, "speculative", "invalid_params"),
        ({"speculative": MODEL}, "speculative", "invalid_params"),  # the answering model drafts nothing
        ({"num_speculative_tokens": 0}, "num_speculative_tokens", "invalid_value"),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens", "invalid_value"),
        ({"num_speculative_tokens": "4"}, "num_speculative_tokens", "invalid_type"),
        ({"prediction": {"type": "content", "content": "x"}, "preset": "Beam search"}, None, "invalid_params"),
    ],
)
async def test_bad_speculation_fields_are_400_naming_the_field(
    engine: FakeEngine, extra: dict[str, Any], param: str | None, code: str | None
) -> None:
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": HI, **extra})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == param and error["message"], error
    if code is not None:
        assert error["code"] == code, error
    assert not await sync_to_async(Generation.objects.exists)()  # a refusal writes nothing


async def test_an_unknown_draft_names_the_drafts_there_are(engine: FakeEngine) -> None:
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": HI, "speculative": "tiny"})
    message = response.json()["error"]["message"]
    assert message.startswith("speculative='tiny'") and "'prompt_lookup'" in message and OTHER_MODEL in message
    await sync_to_async(LanguageModel.objects.filter(name=OTHER_MODEL).update)(is_enabled=False)
    response = await post("/v1/chat/completions", {"model": MODEL, "messages": HI, "speculative": OTHER_MODEL})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "speculative")  # disabled: no draft


async def test_the_engine_has_the_last_word_on_a_draft(engine: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another enabled record passes the web's check. An engine that has it as a draft runs the
    request; one that refuses it (the engine's ValueError at `add`), or a worker that cannot attach
    it (a tokenizer of its own), is a 400 naming `speculative`, not a crash."""
    body = {"model": MODEL, "messages": HI, "speculative": OTHER_MODEL}
    engine.core.speculator.drafts[OTHER_MODEL] = object()  # attached already: the worker loads nothing
    response = await post("/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"]["content"] == "Hi you"

    engine.core.speculator.drafts.clear()
    monkeypatch.setattr(engines, "attach_draft", lambda engine, model, speculative: None)  # attaches nothing
    response = await post("/v1/chat/completions", body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("speculative", "invalid_params")
    assert "is not a draft model of this engine" in error["message"]

    def refuse(engine: Any, model: Any, speculative: str) -> None:
        raise ValueError(f"speculative={speculative!r}: the draft model's tokenizer is not fake's")

    monkeypatch.setattr(engines, "attach_draft", refuse)
    response = await post("/v1/chat/completions", body)
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["code"]) == (400, "speculative", "invalid_params")


async def test_a_prediction_of_the_largest_size_is_taken(engine: FakeEngine) -> None:
    prediction = "Hi you" + "x" * (MAX_PREDICTION_CHARS - 6)
    body = {"model": MODEL, "messages": HI, "prediction": {"type": "content", "content": prediction}}
    response = await post("/v1/chat/completions", body)
    assert response.status_code == 200, response.content
    assert response.json()["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 5


# ---- the real engine, through the official client -------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine():
    return tiny_chat_engine(seed=1)


async def test_the_answer_with_a_prediction_is_the_answer_without(openai_client: openai.AsyncOpenAI) -> None:
    """Greedy on the real engine: the same text whatever the prediction, and usage counts what was verified."""
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"
    settings = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": 0}
    plain = await openai_client.completions.create(**settings)
    assert plain.usage.completion_tokens_details.accepted_prediction_tokens is None  # no prediction: not reported
    for prediction in (plain.choices[0].text, "nothing like it"):
        predicted = await openai_client.completions.create(
            **settings, extra_body={"prediction": {"type": "content", "content": prediction}}
        )
        assert predicted.choices[0].text == plain.choices[0].text
        details = predicted.usage.completion_tokens_details
        assert details.accepted_prediction_tokens >= 0 and details.rejected_prediction_tokens >= 0
        if prediction == plain.choices[0].text:  # the answer itself: some of it is verified and kept
            assert details.accepted_prediction_tokens > 0
    chat = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0}
    plain_chat = await openai_client.chat.completions.create(**chat)
    text = plain_chat.choices[0].message.content
    predicted_chat = await openai_client.chat.completions.create(
        **chat, prediction={"type": "content", "content": text}
    )
    assert predicted_chat.choices[0].message.content == text
    assert predicted_chat.usage.completion_tokens_details.accepted_prediction_tokens is not None
    looked_up = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=24,
        temperature=0,
        extra_body={"speculative": "prompt_lookup", "num_speculative_tokens": 4},
    )
    assert looked_up.choices[0].message.content == text
    with pytest.raises(openai.BadRequestError) as refused:
        await openai_client.chat.completions.create(
            model=MODEL, messages=HI, prediction={"type": "content", "content": 3}
        )
    assert refused.value.body["param"] == "prediction.content"
