"""A grammar in the WebSocket `overrides` (issue 50): the explorer's `complete` and the chat's
`generate` carry a JSON schema, a regex or a list of choices, checked by the code `/v1` uses
(`grammar_spec.check` through `SamplingParams`); a bad one is refused with `invalid_params`
naming the field and nothing is queued. Over the real consumer, with an eager worker running the
REAL engine on a tiny random model: whatever the model prefers, the answer obeys the grammar and
each step says what the grammar removed."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from playground.models import Conversation, Generation
from tests.inference.engines import tiny_chat_engine

from .test_consumer import TIMEOUT_S, assert_refused, command_to_end, connect, token_steps

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny_engine():
    return tiny_chat_engine(seed=2)


@pytest.mark.parametrize(
    "grammar, fragment",
    [
        ({"type": "regexp", "pattern": "a"}, "grammar.type='regexp' must be one of"),
        ({"type": "regex", "pattern": "(ab"}, "grammar.pattern is not supported: unclosed group"),
        ({"type": "regex", "pattern": ""}, "grammar.pattern must be a non-empty string"),
        ({"type": "choice", "choices": []}, "grammar.choices must be a list of 1 to 64 strings"),
        ({"type": "choice", "choices": ["yes", 3]}, "grammar.choices[1]=3"),
        ({"type": "json_schema", "schema": '{"type": "strin"}'}, "grammar.schema is not supported: Invalid type"),
        ({"type": "json_schema", "schema": "{not json"}, "grammar.schema is not JSON"),
        ("yes|no", "grammar='yes|no' must be an object"),
    ],
)
async def test_a_bad_grammar_is_invalid_params_naming_it_and_nothing_is_queued(
    session_key: str, queued_ids: list[int], grammar: Any, fragment: str
) -> None:
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    for name, fields in (("complete", {"text": "Hi"}), ("generate", {"content": "Hi"})):
        refusal = await assert_refused(ws, "invalid_params", name, overrides={"grammar": grammar}, **fields)
        assert fragment in refusal["message"], refusal
    assert queued_ids == []
    assert not await sync_to_async(Generation.objects.exists)()
    assert not await sync_to_async(Conversation.objects.exists)()
    await ws.disconnect()


@pytest.mark.parametrize(
    "grammar, check",
    [
        ({"type": "choice", "choices": ["red", "green", "blue"]}, lambda text: text in ("red", "green", "blue")),
        ({"type": "regex", "pattern": "[0-9]{2}-[a-z]{2}"}, lambda text: re.fullmatch("[0-9]{2}-[a-z]{2}", text)),
        (
            {"type": "json_schema", "schema": json.dumps(SCHEMA)},  # as JSON text: its keys keep their order
            lambda text: list(json.loads(text)) == ["name", "ok"] and len(json.loads(text)["name"]) <= 6,
        ),
    ],
)
async def test_the_explorers_complete_obeys_the_grammar_and_each_step_says_what_it_removed(
    session_key: str, eager: None, grammar: dict, check
) -> None:
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    overrides = {"grammar": grammar, "max_new_tokens": 40, "seed": 3, "num_alternatives": 8, "greedy": False}
    events = await command_to_end(ws, name="complete", text="Hi", overrides=overrides)
    finished = events[-1]
    assert finished["type"] == "generation.finished", finished
    assert check(finished["text"]), finished["text"]
    assert finished["finish_reason"] in ("grammar", "eos")
    steps = token_steps(events)
    assert steps and all(0.0 <= s["masked_prob"] <= 1.0 for s in steps)
    # A random model puts little mass where the grammar allows it: the first step removed most.
    first = steps[0]
    assert first["masked_prob"] > 0.5
    removed = {a["token_id"] for a in first["top_masked"]}
    assert removed and removed <= {a["token_id"] for a in first["top_raw"]}
    assert not removed & {a["token_id"] for a in first["top_processed"]}  # removed: never sampled from
    assert sum(a["prob"] for a in first["top_masked"]) <= first["masked_prob"] + 1e-6
    started = next(e for e in events if e["type"] == "generation.started")
    assert started["params"]["grammar"] == grammar
    await ws.disconnect()


async def test_the_chats_generate_carries_a_grammar_and_a_free_answer_has_no_mask(
    session_key: str, eager: None
) -> None:
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    choices = {"type": "choice", "choices": ["yes", "no"]}
    events = await command_to_end(
        ws, name="generate", content="Yes or no?", overrides={"grammar": choices, "max_new_tokens": 8}
    )
    assert events[-1]["type"] == "generation.finished", events[-1]
    assert events[-1]["text"] in ("yes", "no")
    free = await command_to_end(ws, name="generate", content="Say anything", overrides={"max_new_tokens": 3})
    assert all(s["masked_prob"] is None and s["top_masked"] == [] for s in token_steps(free))
    await ws.disconnect()


async def test_the_explorer_continues_a_path_one_request_at_a_time_under_one_grammar(
    session_key: str, eager: None
) -> None:
    """Each request sends the path's tokens after the text and the same ids as the grammar's
    `prefix_ids`: the grammar goes on from them, so token by token the path is one of the choices."""
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    choices = ["red", "green", "blue"]
    path: list[int] = []
    text = ""
    for _ in range(8):
        grammar = {"type": "choice", "choices": choices, "prefix_ids": path}
        overrides = {"grammar": grammar, "max_new_tokens": 1, "seed": len(path), "greedy": False}
        events = await command_to_end(ws, name="complete", text="Hi", token_ids=path, overrides=overrides)
        assert events[-1]["type"] == "generation.finished", events[-1]
        [step] = token_steps(events)
        path.append(step["token_id"])
        text += step["text_delta"]
        if events[-1]["finish_reason"] in ("grammar", "eos"):
            break
    assert text in choices
    # A path the grammar cannot take fails that request alone, with the reason.
    bad = {"type": "choice", "choices": choices, "prefix_ids": [ord("x")]}
    events = await command_to_end(ws, name="complete", text="Hi", token_ids=[ord("x")], overrides={"grammar": bad})
    assert events[-1]["type"] == "generation.error", events[-1]
    assert events[-1]["code"] == "invalid_params" and "does not fit the grammar" in events[-1]["message"]
    await ws.disconnect()
