"""Speculative decoding in the WebSocket `overrides` (issue 51): `speculative`,
`num_speculative_tokens` and `prediction` pass through generate / complete / regenerate / edit like
any `SamplingParams` field; bad values and unknown drafts are refused with `invalid_params` before
anything is written; a prediction of the largest size fits in a frame. Over the real consumer, with
an eager worker running the REAL engine on a tiny random model: the answer is the same with
speculation as without, its steps carry their verification, and `stats` the Finished numbers."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from inference.sampling_params import MAX_PREDICTION_CHARS
from playground.models import Conversation, Generation, LanguageModel, Message
from tests.inference.engines import tiny_chat_engine

from .test_consumer import TIMEOUT_S, assert_refused, command, command_to_end, connect, token_steps

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

OTHER_MODEL = "Qwen2.5-Coder-0.5B-Instruct (bundled)"
SPECULATION = ("num_proposed_tokens", "num_accepted_tokens", "speculative_speedup")


@pytest.fixture(scope="module")
def tiny_engine():
    return tiny_chat_engine(seed=1)


async def _events(ws, name: str, **fields: Any) -> list[dict[str, Any]]:
    events = await command_to_end(ws, name, **fields)
    assert events[0]["type"] == "generation.queued", events[0]
    return events


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"speculative": "no-such-draft"}, "speculative='no-such-draft' is not an enabled model"),
        ({"speculative": 3}, "speculative=3 must be"),
        ({"speculative": ""}, "speculative='' must be"),
        ({"num_speculative_tokens": 0}, "num_speculative_tokens=0 must be between 1 and 16"),
        ({"num_speculative_tokens": 17}, "num_speculative_tokens=17 must be between 1 and 16"),
        ({"prediction": 5}, "prediction=5 must be a string"),
        ({"prediction": "x" * (MAX_PREDICTION_CHARS + 1)}, f"at most {MAX_PREDICTION_CHARS}"),
        ({"prediction": "x", "use_kv_cache": False}, "need the KV cache"),
    ],
)
async def test_bad_speculation_overrides_are_invalid_params_and_nothing_is_queued(
    session_key: str, queued_ids: list[int], overrides: dict[str, Any], fragment: str
) -> None:
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    for name, fields in (("complete", {"text": "Hi"}), ("generate", {"content": "Hi"})):
        refusal = await assert_refused(ws, "invalid_params", name, overrides=overrides, **fields)
        assert fragment in refusal["message"], refusal
    assert queued_ids == []
    assert not await sync_to_async(Generation.objects.exists)()
    assert not await sync_to_async(Conversation.objects.exists)()
    await ws.disconnect()


async def test_the_answering_model_is_no_draft_of_itself_and_a_disabled_one_is_none(
    session_key: str, queued_ids: list[int], bundled_model: LanguageModel
) -> None:
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    own = {"speculative": bundled_model.name}
    refusal = await assert_refused(
        ws, "invalid_params", "complete", text="Hi", model_id=bundled_model.pk, overrides=own
    )
    assert "is the model that answers" in refusal["message"]
    # Another enabled record passes the web's check (the worker's engine then has the last word).
    other = {"speculative": OTHER_MODEL}
    queued = await command(ws, "complete", text="Hi", model_id=bundled_model.pk, overrides=other)
    assert queued["type"] == "generation.queued", queued
    await sync_to_async(LanguageModel.objects.filter(name=OTHER_MODEL).update)(is_enabled=False)
    await assert_refused(ws, "invalid_params", "complete", text="Hi", model_id=bundled_model.pk, overrides=other)
    assert len(queued_ids) == 1
    await ws.disconnect()


async def test_a_prediction_of_the_largest_size_fits_a_frame(session_key: str, queued_ids: list[int]) -> None:
    """100,000 characters of prediction (3 bytes each in UTF-8) beside a prompt: within the frame limit."""
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    prediction = "词" * MAX_PREDICTION_CHARS
    queued = await command(ws, "generate", content="Rewrite it.", overrides={"prediction": prediction})
    assert queued["type"] == "generation.queued", queued
    row = await sync_to_async(Generation.objects.get)(pk=queued["generation_id"])
    assert row.params["prediction"] == prediction
    await ws.disconnect()


async def test_the_overrides_pass_through_every_command_and_the_answer_is_the_same(
    session_key: str, eager: None
) -> None:
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    base = {"max_new_tokens": 16, "greedy": True, "repetition_penalty": 1.0}
    plain = await _events(ws, "complete", text="abcabcabc", overrides=base)
    text = plain[-1]["text"]
    assert plain[-1]["stats"]["num_proposed_tokens"] == 0 and plain[-1]["stats"]["speculative_speedup"] == 1.0
    assert all(step["verification"] is None for step in token_steps(plain))

    speculating = {**base, "prediction": text, "num_speculative_tokens": 4}
    events = await _events(ws, "complete", text="abcabcabc", overrides=speculating)
    finished = events[-1]
    assert finished["type"] == "generation.finished", finished
    assert finished["text"] == text  # token for token the same
    stats = finished["stats"]
    assert stats["num_proposed_tokens"] > 0 and 0 <= stats["num_accepted_tokens"] <= stats["num_proposed_tokens"]
    verified = [step["verification"] for step in token_steps(events) if step["verification"] is not None]
    assert verified and {v["source"] for v in verified} == {"prediction"}
    assert set(verified[0]["proposed"][0]) == {"token_id", "piece", "draft_prob", "prob", "is_accepted"}
    # The saved row: its params, its stats under the engine's names, its steps with their verification.
    row = await sync_to_async(Generation.objects.get)(pk=finished["generation_id"])
    assert (row.params["prediction"], row.params["num_speculative_tokens"]) == (text, 4)
    assert {k: row.stats[k] for k in SPECULATION} == {k: stats[k] for k in SPECULATION}
    assert [s["verification"] for s in row.steps] == [s["verification"] for s in token_steps(events)]

    # generate, then regenerate and edit with speculation: each row carries the overrides.
    lookup = {**base, "speculative": "prompt_lookup"}
    events = await _events(ws, "generate", content="abcabcabc", overrides=lookup)
    answer_id, first = events[0]["message_id"], events[-1]
    assert first["type"] == "generation.finished", first
    events = await _events(ws, "regenerate", message_id=answer_id, overrides={**lookup, "greedy": True})
    assert events[-1]["text"] == first["text"]  # greedy asked for: the same answer
    user_id = await sync_to_async(
        lambda: Message.objects.filter(role="user", is_active=True).values_list("pk", flat=True).get()
    )()
    events = await _events(ws, "edit", message_id=user_id, content="abcabcabc", overrides={**lookup, "prediction": "x"})
    assert events[-1]["text"] == first["text"]
    rows = await sync_to_async(list)(Generation.objects.order_by("pk").values_list("params", flat=True))
    assert [(p["speculative"], p["prediction"]) for p in rows[2:]] == [
        ("prompt_lookup", None),
        ("prompt_lookup", None),
        ("prompt_lookup", "x"),
    ]
    await ws.disconnect()
