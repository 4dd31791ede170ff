"""End to end over real processes: browser socket -> daphne -> Redis -> Celery worker ->
engine -> Redis channel layer -> browser, plus stop and a killed worker."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from .wsclient import BrowserTab, ends_request, receive, receive_until, send, steps_of, streamed_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NUM_ALTERNATIVES = 5
# Plain greedy (the default preset adds a repetition penalty): the chosen token is the raw top one.
SHORT = {
    "max_new_tokens": 12,
    "greedy": True,
    "repetition_penalty": 1.0,
    "ignore_eos": True,
    "num_alternatives": NUM_ALTERNATIVES,
}
LONG = {"max_new_tokens": 200, "greedy": True, "ignore_eos": True}
ENDLESS = {**LONG, "max_new_tokens": 2000}  # never ends before the test acts, even on a fast box
NUM_STEPS_BEFORE_ACTING = 3
# The worker saves the partial answer about once a second; stream longer than that before
# killing it, so there is something to keep.
STREAM_BEFORE_KILL_S = 2.5


def streamed_enough(num_steps: int = 1, seconds: float = 0.0) -> Callable[[dict], bool]:
    """A `receive_until` condition: `num_steps` steps arrived, the first of them `seconds`
    ago or more (or the generation ended anyway)."""
    seen: list[dict] = []
    first_step_at: list[float] = []

    def is_done(event: dict) -> bool:
        seen.append(event)
        num_seen = len(steps_of(seen))
        if num_seen and not first_step_at:
            first_step_at.append(time.monotonic())
        return ends_request(event) or (num_seen >= num_steps and time.monotonic() - first_step_at[0] >= seconds)

    return is_done


def conversation_of(tab: BrowserTab, conversation_id: int) -> dict:
    status, body = tab.get_json(f"/api/conversations/{conversation_id}/")
    assert status == 200, body
    return body


def check_step(step: dict) -> None:
    for key in ("top_raw", "top_processed"):
        alternatives = step[key]
        assert 1 <= len(alternatives) <= NUM_ALTERNATIVES
        probs = [a["prob"] for a in alternatives]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    # greedy without penalties: the chosen token is the top one of both distributions
    assert step["token_id"] == step["top_raw"][0]["token_id"] == step["top_processed"][0]["token_id"]
    assert step["rank"] == 1


def test_generate_streams_every_event_and_keeps_the_conversation(tab: BrowserTab) -> None:
    with tab.connect() as ws:
        send(ws, "generate", request_id="r1", content="Name one colour.", overrides=SHORT)
        events = receive_until(ws, ends_request)

    types = [event["type"] for event in events]
    assert types[:3] == ["generation.queued", "generation.started", "generation.prefilled"], types
    assert types[-1] == "generation.finished", events[-1]
    assert set(types[3:-1]) == {"generation.tokens"}
    assert types.count("generation.tokens") >= 2  # streamed in batches, not all at the end
    queued, started, prefilled, finished = events[0], events[1], events[2], events[-1]
    assert queued["request_id"] == "r1"
    assert {event["generation_id"] for event in events} == {queued["generation_id"]}

    prompt = started["prompt"]
    assert "Name one colour." in prompt["text"]
    assert prompt["spans"] and all(0 <= s["start"] < s["end"] <= len(prompt["text"]) for s in prompt["spans"])
    assert {"role", "content"} <= {s["kind"] for s in prompt["spans"]}
    assert prefilled["num_prompt_tokens"] == len(prompt["tokens"]) > 0

    steps = steps_of(events)
    assert [step["index"] for step in steps] == list(range(SHORT["max_new_tokens"]))
    assert [step["phase"] for step in steps] == ["prefill"] + ["decode"] * (len(steps) - 1)
    for step in steps:
        check_step(step)
    assert finished["finish_reason"] == "length"
    assert finished["text"] == streamed_text(events) != ""
    assert finished["stats"]["num_generated_tokens"] == len(steps)
    assert finished["stats"]["num_prompt_tokens"] == len(prompt["tokens"])

    conversation = conversation_of(tab, queued["conversation_id"])
    user, assistant = conversation["messages"]
    assert (user["role"], user["content"], user["id"]) == ("user", "Name one colour.", queued["user_message_id"])
    assert (assistant["role"], assistant["content"]) == ("assistant", finished["text"])
    assert assistant["id"] == queued["message_id"] == finished["message_id"]
    assert assistant["generation_id"] == queued["generation_id"]

    stranger = BrowserTab(tab.base_url, tab.ws_url)
    assert stranger.get("/")[0] == 200
    assert stranger.get_json(f"/api/conversations/{queued['conversation_id']}/")[0] == 404


def test_stop_mid_generation_keeps_the_partial_answer(tab: BrowserTab, live_stack) -> None:
    with tab.connect() as ws:
        send(ws, "generate", content="Count from one to one hundred in words.", overrides=LONG)
        events = receive_until(ws, streamed_enough(num_steps=NUM_STEPS_BEFORE_ACTING))
        queued = events[0]
        send(ws, "stop", generation_id=queued["generation_id"])
        events += receive_until(ws, ends_request)

        finished = events[-1]
        assert finished["type"] == "generation.finished", finished
        assert finished["finish_reason"] == "cancelled"
        assert NUM_STEPS_BEFORE_ACTING <= finished["stats"]["num_generated_tokens"] < LONG["max_new_tokens"]
        assert finished["text"] == streamed_text(events) != ""
        assistant = conversation_of(tab, queued["conversation_id"])["messages"][-1]
        assert assistant["content"] == finished["text"]
        assert live_stack.worker.is_alive()

        send(ws, "generate", content="And now say hi.", conversation_id=queued["conversation_id"], overrides=SHORT)
        assert receive_until(ws, ends_request)[-1]["finish_reason"] == "length"


def test_killed_worker_ends_the_generation_with_one_worker_lost_error(tab: BrowserTab, live_stack) -> None:
    try:
        with tab.connect() as ws:
            send(ws, "generate", content="Tell me a long story about a lighthouse.", overrides=ENDLESS)
            events = receive_until(ws, streamed_enough(seconds=STREAM_BEFORE_KILL_S))
            assert not ends_request(events[-1]), events[-1]
            queued = events[0]
            live_stack.worker.kill()
            events += receive_until(ws, ends_request, timeout_s=60)

            error = events[-1]
            assert (error["type"], error["code"]) == ("generation.error", "worker_lost"), error
            assert error["generation_id"] == queued["generation_id"]
            with pytest.raises(TimeoutError):  # exactly one terminal event: nothing follows it
                extra = receive(ws, timeout_s=5)
                pytest.fail(f"unexpected event after the terminal one: {extra}")

        messages = conversation_of(tab, queued["conversation_id"])["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        kept = messages[1]["content"]
        assert kept and streamed_text(events).startswith(kept)

        live_stack.start_worker()
        with tab.connect() as ws:
            send(ws, "generate", content="Still there?", conversation_id=queued["conversation_id"], overrides=SHORT)
            assert receive_until(ws, ends_request)[-1]["type"] == "generation.finished"
    finally:
        live_stack.ensure_worker()


def test_the_worker_loaded_its_default_model_when_it_started_and_every_page_can_see_it(
    tab: BrowserTab, live_stack
) -> None:
    """The worker loads the default model before it takes work and announces it; a page that
    follows the models learns its state (here long "ready", with the load's time), and the first
    answer waits for no load (no `model_load_ms` in its stats)."""
    with tab.connect() as ws:
        send(ws, "follow_models")
        event = receive(ws, timeout_s=10)
        while event.get("worker") != live_stack.worker_name:  # a worker an earlier test killed: listed for 5 s
            assert event["type"] == "worker.model", event
            event = receive(ws, timeout_s=10)
        assert (event["state"], event["model_name"]) == ("ready", "SmolLM2-135M-Instruct (bundled)")
        assert event["load_ms"] > 0 and event["elapsed_ms"] >= 0
        send(ws, "generate", request_id="r1", content="Name one colour.", overrides=SHORT)
        events = receive_until(ws, ends_request)
    assert events[-1]["type"] == "generation.finished", events[-1]
    assert "model_load_ms" not in events[-1]["stats"] and events[-1]["stats"]["ttft_ms"] > 0
