"""The worker side with a fake engine: the event stream, what is saved, and exactly one
terminal event on success, failure and stop."""

from __future__ import annotations

import time
from typing import Any

import pytest

from inference.sampling_params import SamplingParams
from playground import protocol
from playground.coord import cancel, recent_steps, store
from playground.models import ChatTemplate, Generation, Message
from playground.protocol import is_terminal
from playground.web import submit
from playground.web.api import generation_json
from playground.worker import generation, row_writer, serve_loop
from playground.worker.publisher import MAX_STEPS
from tests.playground.fake_engine import R1_CHATML, FakeEngine

pytestmark = pytest.mark.django_db

ANSWER = "Hello there, friend!"  # 20 characters = 20 steps


def queue_chat(owner: str, content: str = "Hi!", **fields: Any) -> submit.Queued:
    return submit.generate(owner, {"content": content, **fields})


def run(generation_id: int, engine: FakeEngine | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    generation.run_generation(
        generation_id, "worker-1", load_engine=lambda model: engine or FakeEngine(), send=events.append, **kwargs
    )
    return events


def steps_of(events: list[dict[str, Any]], kind: str = "generation.tokens") -> list[dict[str, Any]]:
    return [step for event in events if event["type"] == kind for step in protocol.steps_of(event)]


def test_a_chat_generation_streams_coalesced_steps_then_finishes_once(owner: str) -> None:
    queued = queue_chat(owner, "Hi!", system_prompt="Be brief.", overrides={"max_new_tokens": 64})
    engine = FakeEngine(ANSWER)
    events = run(queued.generation_id, engine)

    types = [event["type"] for event in events]
    assert types[:2] == ["generation.started", "generation.prefilled"]
    assert set(types[2:-1]) == {"generation.tokens"} and types[-1] == "generation.finished"
    assert [is_terminal(event) for event in events].count(True) == 1
    assert all(1 <= len(protocol.steps_of(event)) <= MAX_STEPS for event in events[2:-1])
    steps = steps_of(events)
    assert [step["index"] for step in steps] == list(range(len(ANSWER)))
    assert "".join(step["text_delta"] for step in steps) == ANSWER
    assert steps[0]["top_processed"][1]["logprob"] is None  # -inf is not JSON

    started, finished = events[0], events[-1]
    prompt = started["prompt"]
    assert prompt["text"].index("Be brief.") < prompt["text"].index("Hi!")  # system prompt first
    assert [token["id"] for token in prompt["tokens"]] == engine.prompt_ids
    assert {"role", "content"} <= {span["kind"] for span in prompt["spans"]}
    assert (started["worker"], started["model"]["name"]) == ("worker-1", "fake")
    assert (finished["finish_reason"], finished["text"], finished["message_id"]) == (
        "length",
        ANSWER,
        queued.message_id,
    )
    assert finished["stats"]["num_generated_tokens"] == len(ANSWER)
    assert finished["stats"]["worker"] == "worker-1"
    assert finished["stats"]["prefix_cache"]["misses"] == 1  # the worker's cache counters travel along

    generation = Generation.objects.get(pk=queued.generation_id)
    assert (generation.status, generation.text, generation.finish_reason) == ("finished", ANSWER, "length")
    assert generation.steps == steps
    assert generation.num_prompt_tokens == len(engine.prompt_ids) and generation.ttft_ms == 6.0
    assert generation.prompt_text == prompt["text"] and generation.prompt["tokens"] == prompt["tokens"]
    assert Message.objects.get(pk=queued.message_id).content == ANSWER


def test_published_steps_wait_in_redis_until_the_row_holds_them(owner: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step is in the recent-steps tail before it is published, until a save of the row has
    it: whenever a reloaded page reads tail then row, it gets every published step."""
    monkeypatch.setattr(row_writer, "SAVE_PARTIAL_EVERY_S", 0.0)  # save the row at every step
    monkeypatch.setattr(row_writer, "STEPS_SAVED_PER_S", float("inf"))  # its steps too
    queued = queue_chat(owner, overrides={"max_new_tokens": 64})
    gaps: list[int] = []

    def check(event: dict[str, Any]) -> None:
        if event["type"] != "generation.tokens":
            return
        tail = recent_steps.read(queued.generation_id)
        row = Generation.objects.get(pk=queued.generation_id)
        _, steps = recent_steps.merged(row.text, row.steps, tail, is_running=True)
        indices = [s["index"] for s in steps]
        gaps.append(indices != list(range(len(indices))) or indices[-1] < protocol.steps_of(event)[-1]["index"])

    events: list[dict[str, Any]] = []
    generation.run_generation(
        queued.generation_id,
        "worker-1",
        load_engine=lambda model: FakeEngine(ANSWER),
        send=lambda event: (check(event), events.append(event)),
    )
    assert len(gaps) > 1 and not any(gaps)
    assert recent_steps.read(queued.generation_id) == []  # the row holds them all; the tail is gone


def test_the_text_is_saved_at_its_interval_while_the_growing_steps_wait_in_redis(
    owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps list is rewritten whole at each save, so it is saved less often as it grows; the
    answer's text is not held back, and a reloaded page still gets every step (row + tail)."""
    monkeypatch.setattr(row_writer, "SAVE_PARTIAL_EVERY_S", 0.0)
    monkeypatch.setattr(row_writer, "STEPS_SAVED_PER_S", 1e-9)  # steps: only at the end
    queued = queue_chat(owner)
    seen: list[tuple[str, int, int]] = []  # (row text, row steps, merged steps) at each message
    snapshots: list[tuple[str, int]] = []  # what a page reloaded then gets: text, number of steps

    def check(event: dict[str, Any]) -> None:
        if event["type"] == "generation.tokens":
            row = Generation.objects.get(pk=queued.generation_id)
            tail = recent_steps.read(queued.generation_id)
            text, steps = recent_steps.merged(row.text, row.steps, tail, is_running=True)
            seen.append((row.text, len(row.steps), len(steps)))
            snapshots.append((text, len(steps)))

    generation.run_generation(
        queued.generation_id, "worker-1", load_engine=lambda model: FakeEngine(ANSWER), send=check
    )
    published = [len(text) for text, _, _ in seen]  # one character per step
    assert len(seen) > 1 and published == sorted(published) and published[-1] >= len(ANSWER) - 8
    assert all(num_saved == 0 for _, num_saved, _ in seen)
    assert all(num_merged >= num_text for (_, _, num_merged), num_text in zip(seen, published))
    # The row's text may run ahead of the published steps (a step is in it before its message
    # goes out): the snapshot's text is its steps' own, so the live steps after it continue it.
    assert all(text == ANSWER[:num_steps] for text, num_steps in snapshots)
    assert len(Generation.objects.get(pk=queued.generation_id).steps) == len(ANSWER)


def test_the_worker_beats_while_it_runs(owner: str) -> None:
    queued = queue_chat(owner)
    key = f"playground:generation:{queued.generation_id}"
    beating: list[bool] = []
    run(queued.generation_id, FakeEngine(on_step=lambda index: beating.append(bool(store.client().exists(key)))))
    assert beating and all(beating)
    assert not store.client().exists(key)


def test_an_engine_failure_ends_with_one_internal_error_and_keeps_the_partial_answer(owner: str) -> None:
    queued = queue_chat(owner)
    events = run(queued.generation_id, FakeEngine(ANSWER, fail_after=3))

    assert [is_terminal(event) for event in events].count(True) == 1
    error = events[-1]
    assert (error["type"], error["code"]) == ("generation.error", "internal_error")
    assert "the fake model broke" in error["message"]
    assert "".join(step["text_delta"] for step in steps_of(events)) == "Hel"  # sent before the error
    generation = Generation.objects.get(pk=queued.generation_id)
    assert (generation.status, generation.error_code, generation.text) == ("error", "internal_error", "Hel")
    assert Message.objects.get(pk=queued.message_id).content == "Hel"


def test_a_stop_request_ends_the_generation_as_cancelled(owner: str) -> None:
    queued = queue_chat(owner)

    def stop_at_third_step(index: int) -> None:
        if index == 2:
            cancel.request_cancel(queued.generation_id)
            time.sleep(4 * serve_loop.CANCEL_POLL_S)  # the cancel watch reads the flags this often

    events = run(queued.generation_id, FakeEngine(ANSWER, on_step=stop_at_third_step))
    finished = events[-1]
    assert (finished["type"], finished["finish_reason"], finished["text"]) == (
        "generation.finished",
        "cancelled",
        "Hel",
    )
    assert [is_terminal(event) for event in events].count(True) == 1
    assert Generation.objects.get(pk=queued.generation_id).status == "cancelled"
    assert not cancel.is_cancel_requested(queued.generation_id)  # the flag does not outlive the run


def test_a_model_that_fails_to_load_is_model_unavailable(owner: str) -> None:
    queued = queue_chat(owner)

    def broken_loader(model: Any) -> FakeEngine:
        raise OSError("no such file")

    events: list[dict[str, Any]] = []
    generation.run_generation(queued.generation_id, "w", load_engine=broken_loader, send=events.append)
    assert [(e["type"], e.get("code")) for e in events] == [("generation.error", "model_unavailable")]
    assert "no such file" in events[0]["message"]


def test_a_model_switch_that_waited_out_the_other_models_requests_is_server_busy(
    owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Choosing the other bundled model while the worker serves this one was `model_unavailable`,
    as if the model were broken (issue 46): it is the server that is busy, and the message says so."""
    from types import SimpleNamespace

    from playground.worker import engines

    busy_engine = SimpleNamespace(info=SimpleNamespace(name="Qwen (bundled)"))
    monkeypatch.setattr(engines, "SWITCH_TIMEOUT_S", 0.2)
    monkeypatch.setitem(engines._loops, id(busy_engine), SimpleNamespace(num_requests=3))

    def switching_loader(model: Any) -> FakeEngine:
        engines._wait_until_idle(busy_engine)
        raise AssertionError("the switch went on")

    events: list[dict[str, Any]] = []
    generation.run_generation(queue_chat(owner).generation_id, "w", load_engine=switching_loader, send=events.append)
    assert [(e["type"], e.get("code")) for e in events] == [("generation.error", "server_busy")]
    assert "serves Qwen (bundled) to 3 request(s)" in events[0]["message"]


def test_a_prompt_over_the_token_limit_is_refused_by_the_worker(owner: str, settings: Any) -> None:
    settings.PLAYGROUND_MAX_PROMPT_TOKENS = 10
    queued = queue_chat(owner, "a question longer than ten tokens")
    events = run(queued.generation_id)
    assert [(e["type"], e.get("code")) for e in events] == [("generation.error", "prompt_too_long")]


def test_a_prompt_that_fills_the_context_is_refused(owner: str) -> None:
    queued = queue_chat(owner)
    events = run(queued.generation_id, FakeEngine(max_context=8))
    assert events[-1]["code"] == "prompt_too_long" and "context of 8" in events[-1]["message"]


def test_a_generation_that_is_no_longer_queued_is_skipped(owner: str) -> None:
    queued = queue_chat(owner)
    Generation.objects.filter(pk=queued.generation_id).update(status=Generation.Status.CANCELLED)
    assert run(queued.generation_id) == []


def test_a_raw_completion_appends_the_branch_tokens(owner: str) -> None:
    queued = submit.complete(owner, {"text": "The sky", "token_ids": [32, 105], "overrides": {"max_new_tokens": 3}})
    engine = FakeEngine("abc")
    events = run(queued.generation_id, engine)
    assert engine.prompt_ids == [ord(c) for c in "The sky"] + [32, 105]
    assert engine.rendered == []  # no chat template for a raw completion
    assert events[0]["prompt"]["text"] == "The sky"
    assert (events[-1]["type"], events[-1]["message_id"], events[-1]["text"]) == ("generation.finished", None, "abc")


def tiny_engine(arch: str, add_bos_token: bool):
    """A real engine over a tiny random model whose tokenizer does or does not ask for BOS."""
    from pathlib import Path

    import torch

    from inference.config import EngineConfig
    from inference.engine import Engine
    from inference.models.loader import LoadedModel
    from inference.models.tiny import make_tiny_model, make_tiny_tokenizer

    model = make_tiny_model(arch)
    tokenizer = make_tiny_tokenizer(("<bos>", "<eos>"), add_bos_token=add_bos_token)
    cpu = torch.device("cpu")
    loaded = LoadedModel(model, tokenizer, f"tiny-{arch}", Path("."), torch.float32, cpu, None, 256, (257,))
    return Engine(loaded, EngineConfig())


def test_raw_text_starts_with_bos_when_the_tokenizer_asks_for_it_and_the_prompt_view_shows_it(owner: str) -> None:
    """A Gemma-style model (its tokenizer's add_bos_token) reads raw text after BOS, as llama.cpp
    gives it; without BOS such models continue "The capital of France is" with " France of France"."""
    queued = submit.complete(owner, {"text": "The capital", "overrides": {"max_new_tokens": 2}})
    events = run(queued.generation_id, tiny_engine("gemma3", add_bos_token=True))
    prompt = events[0]["prompt"]
    assert [t["id"] for t in prompt["tokens"]] == [256, *b"The capital"]
    assert prompt["text"] == "<bos>The capital"
    assert prompt["spans"] == [
        {"start": 0, "end": 5, "kind": "special", "role": None},
        {"start": 5, "end": 16, "kind": "content", "role": None},
    ]
    assert events[-1]["type"] == "generation.finished"
    assert Generation.objects.get(pk=queued.generation_id).num_prompt_tokens == 12


def test_raw_text_gets_no_bos_from_a_tokenizer_that_does_not_ask(owner: str) -> None:
    queued = submit.complete(owner, {"text": "The capital", "overrides": {"max_new_tokens": 2}})
    events = run(queued.generation_id, tiny_engine("llama", add_bos_token=False))
    assert [t["id"] for t in events[0]["prompt"]["tokens"]] == list(b"The capital")
    assert events[0]["prompt"]["text"] == "The capital"


def test_beam_search_streams_beam_steps(owner: str) -> None:
    queued = queue_chat(owner, overrides={"num_beams": 2, "max_new_tokens": 5})
    events = run(queued.generation_id, FakeEngine(ANSWER))
    assert {e["type"] for e in events[2:-1]} == {"generation.beams"}
    assert [step["index"] for step in steps_of(events, "generation.beams")] == list(range(5))
    assert events[-1]["text"] == ANSWER[:5]


def test_a_regenerated_answer_sees_only_the_history_before_it(owner: str) -> None:
    first = queue_chat(owner, "One?")
    run(first.generation_id, FakeEngine("1"))
    second = queue_chat(owner, "Two?", conversation_id=first.conversation_id)
    run(second.generation_id, FakeEngine("2"))

    again = submit.regenerate(owner, {"message_id": first.message_id})
    engine = FakeEngine("uno")
    run(again.generation_id, engine)
    assert engine.rendered[-1][0] == [{"role": "user", "content": "One?"}]
    conversation = Generation.objects.get(pk=again.generation_id).conversation
    assert [(m.role, m.content) for m in conversation.active_messages()] == [("user", "One?"), ("assistant", "uno")]
    assert Message.objects.filter(conversation=conversation).count() == 5  # the old ones stay on record


def test_regenerate_under_a_greedy_preset_samples_unless_the_command_asks_for_greedy(owner: str) -> None:
    first = queue_chat(owner, "One?")  # the default preset (Greedy)
    assert Generation.objects.get(pk=first.generation_id).params["greedy"] is True
    run(first.generation_id, FakeEngine("1"))
    again = submit.regenerate(owner, {"message_id": first.message_id})
    params = Generation.objects.get(pk=again.generation_id).params
    assert (params["greedy"], params["temperature"]) == (False, submit.REGENERATE_TEMPERATURE)
    run(again.generation_id, FakeEngine("2"))
    greedy = submit.regenerate(owner, {"message_id": again.message_id, "overrides": {"temperature": 0}})
    assert SamplingParams.from_dict(Generation.objects.get(pk=greedy.generation_id).params).is_greedy


def test_the_worker_sends_the_reasoning_split_when_the_prompt_opens_a_think_block(owner: str) -> None:
    """DeepSeek-R1's template ends the prompt with `<think>`: the answer starts inside the
    reasoning. The worker, not the browser, says where the blocks are."""
    answer = "plan\n</think>\n\nParis"
    queued = submit.complete(owner, {"text": "Capital of France?<think>\n", "max_new_tokens": 64})
    events = run(queued.generation_id, FakeEngine(answer))
    streamed = [event["segments"] for event in events if event["type"] == "generation.tokens"]
    assert streamed[0][0]["kind"] == "reasoning" and streamed[0][0]["is_open"]
    finished = events[-1]
    assert [(s["kind"], answer[s["start"] : s["end"]].strip(), s["is_open"]) for s in finished["segments"]] == [
        ("reasoning", "plan", False),
        ("answer", "Paris", False),
    ]


def test_the_prompt_record_says_which_earlier_reasoning_the_template_dropped(owner: str) -> None:
    first = queue_chat(owner, "One?")
    run(first.generation_id, FakeEngine("<think>counting</think>1"))
    conversation = Generation.objects.get(pk=first.generation_id).conversation
    conversation.chat_template = ChatTemplate.objects.create(name="R1 ChatML", source=R1_CHATML)
    conversation.save()
    second = queue_chat(owner, "Two?", conversation_id=first.conversation_id)
    started = run(second.generation_id, FakeEngine("2"))[0]
    assert started["type"] == "generation.started"
    prompt = started["prompt"]
    assert "counting" not in prompt["text"] and prompt["text"].endswith("<think>\n")
    assert prompt["dropped_reasoning"] == [1]  # the first answer (user, assistant, user)
    assert generation_json(Generation.objects.get(pk=second.generation_id))["prompt"]["dropped_reasoning"] == [1]
    conversation.chat_template = None  # back to the model's ChatML, which keeps the reasoning
    conversation.save()
    third = queue_chat(owner, "Three?", conversation_id=first.conversation_id)
    prompt = run(third.generation_id, FakeEngine("3"))[0]["prompt"]
    assert "counting" in prompt["text"] and prompt["dropped_reasoning"] == []


def test_without_a_think_block_the_whole_answer_is_one_answer_segment(owner: str) -> None:
    queued = queue_chat(owner, "Hi!", overrides={"max_new_tokens": 64})
    finished = run(queued.generation_id, FakeEngine(ANSWER))[-1]
    assert finished["segments"] == [{"kind": "answer", "start": 0, "end": len(ANSWER), "is_open": False}]
