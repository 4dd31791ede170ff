"""A conversation that outgrows the model's context goes on: its oldest turns are left out of
the prompt (whole turns, the new message always kept, the prompt record says how many), and a
turn refused as too long does not make every later turn too long as well."""

from __future__ import annotations

from typing import Any

import pytest

from playground.models import Generation, Message
from playground.web import submit
from playground.worker import generation
from tests.playground.fake_engine import FakeEngine

pytestmark = pytest.mark.django_db

CONTEXT = 600  # the fake model's context, in tokens (one per character)


def run(generation_id: int, engine: FakeEngine) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    generation.run_generation(generation_id, "worker-1", load_engine=lambda model: engine, send=events.append)
    return events


def say(owner: str, text: str, conversation_id: int | None = None, answer: str = "") -> submit.Queued:
    """A turn: the user's message, and (when `answer` is given) an answer that finished."""
    fields: dict[str, Any] = {"content": text, "overrides": {"max_new_tokens": 40}}
    if conversation_id is not None:
        fields["conversation_id"] = conversation_id
    queued = submit.generate(owner, fields)
    if answer:
        Generation.objects.filter(pk=queued.generation_id).update(status="finished", text=answer)
        Message.objects.filter(pk=queued.message_id).update(content=answer)
    return queued


def test_the_oldest_turns_are_left_out_once_the_conversation_outgrows_the_context(owner: str) -> None:
    first = say(owner, "Q1 " + "a" * 100, answer="A1 " + "b" * 100)
    for number in range(2, 5):  # four turns of ~200 characters: more than the 600-token context
        say(owner, f"Q{number} " + "a" * 100, first.conversation_id, answer=f"A{number} " + "b" * 100)
    queued = say(owner, "Q5 the new question", first.conversation_id)

    engine = FakeEngine("fine", max_context=CONTEXT)
    events = run(queued.generation_id, engine)

    assert events[-1]["type"] == "generation.finished", events[-1]
    prompt = events[0]["prompt"]
    assert prompt["num_dropped_messages"] > 0 and prompt["num_dropped_messages"] % 2 == 0  # whole turns
    assert "Q5 the new question" in prompt["text"] and "Q1 " not in prompt["text"]
    assert len(engine.prompt_ids) <= CONTEXT - 40  # room left for the answer (max_new_tokens)
    kept_user = [m["content"] for m in engine.rendered[-1][0] if m["role"] == "user"]
    assert kept_user[0].startswith(("Q2", "Q3", "Q4")) and kept_user[-1] == "Q5 the new question"
    record = Generation.objects.get(pk=queued.generation_id).prompt
    assert record["num_dropped_messages"] == prompt["num_dropped_messages"]


def test_a_conversation_that_fits_is_sent_whole(owner: str) -> None:
    first = say(owner, "Q1", answer="A1")
    queued = say(owner, "Q2", first.conversation_id)
    events = run(queued.generation_id, FakeEngine("ok", max_context=CONTEXT))
    assert events[0]["prompt"]["num_dropped_messages"] == 0 and "Q1" in events[0]["prompt"]["text"]


def test_a_turn_refused_as_too_long_is_not_sent_again(owner: str) -> None:
    first = say(owner, "Q1", answer="A1")
    huge = say(owner, "x" * 2000, first.conversation_id)
    refused = run(huge.generation_id, FakeEngine("never", max_context=CONTEXT))
    assert (refused[-1]["type"], refused[-1]["code"]) == ("generation.error", "prompt_too_long")

    queued = say(owner, "Q3 shorter", first.conversation_id)
    engine = FakeEngine("ok", max_context=CONTEXT)
    events = run(queued.generation_id, engine)
    assert events[-1]["type"] == "generation.finished", events[-1]
    assert "x" * 100 not in events[0]["prompt"]["text"] and "Q1" in events[0]["prompt"]["text"]
    assert events[0]["prompt"]["num_dropped_messages"] == 0


def test_a_new_message_too_long_by_itself_is_still_refused(owner: str) -> None:
    first = say(owner, "Q1", answer="A1")
    queued = say(owner, "y" * 2000, first.conversation_id)
    events = run(queued.generation_id, FakeEngine("never", max_context=CONTEXT))
    assert (events[-1]["type"], events[-1]["code"]) == ("generation.error", "prompt_too_long")


def test_only_the_newest_messages_up_to_the_limit_are_read_and_rendered(owner: str, settings: Any) -> None:
    """A conversation's length bounds no render: past `PLAYGROUND_MAX_MESSAGES` the oldest are left
    out before the template runs (each message costs its role markers, however short)."""
    first = say(owner, "Q1", answer="A1")
    for number in range(2, 5):
        say(owner, f"Q{number}", first.conversation_id, answer=f"A{number}")
    queued = say(owner, "Q5", first.conversation_id)
    settings.PLAYGROUND_MAX_MESSAGES = 3  # of the 9 messages before the answer

    engine = FakeEngine("fine", max_context=CONTEXT)
    events = run(queued.generation_id, engine)

    assert events[-1]["type"] == "generation.finished", events[-1]
    rendered = [(m["role"], m["content"]) for m in engine.rendered[-1][0]]
    assert rendered == [("user", "Q4"), ("assistant", "A4"), ("user", "Q5")]
    assert events[0]["prompt"]["num_dropped_messages"] == 6

    settings.PLAYGROUND_MAX_MESSAGES = 2  # A4, Q5: a cut history starts at a user's turn
    events = run(say(owner, "Q6", first.conversation_id).generation_id, engine)
    assert [(m["role"], m["content"]) for m in engine.rendered[-1][0]] == [("user", "Q6")]
    assert events[0]["prompt"]["num_dropped_messages"] == 10
