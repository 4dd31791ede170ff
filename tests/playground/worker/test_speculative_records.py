"""Speculative decoding on the worker side (issue 51), with the fake engine: each step's
`verification` reaches the published and the saved token records unchanged, the `Finished`
record's `num_proposed_tokens`, `num_accepted_tokens` and `speculative_speedup` reach the
`generation.finished` stats and the row's (what the pages and `GET /api/generations/<id>/` read),
and an engine that refuses the draft ends the generation with `invalid_params` naming `speculative`."""

from __future__ import annotations

from typing import Any

import pytest

from playground import protocol
from playground.models import Generation, LanguageModel
from playground.web import submit
from playground.web.api import generation_json
from playground.worker import engines, generation
from tests.playground.fake_engine import FakeEngine

pytestmark = pytest.mark.django_db

SPECULATION = ("num_proposed_tokens", "num_accepted_tokens", "speculative_speedup")


def run(generation_id: int, engine: FakeEngine) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    generation.run_generation(generation_id, "worker-1", load_engine=lambda model: engine, send=events.append)
    return events


def steps_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [step for event in events if event["type"] == "generation.tokens" for step in protocol.steps_of(event)]


def test_verifications_reach_the_token_records_and_the_counts_the_stats(owner: str) -> None:
    queued = submit.generate(owner, {"content": "Hi!", "overrides": {"prediction": "Hello thEre"}})
    events = run(queued.generation_id, FakeEngine("Hello there"))
    steps, finished = steps_of(events), events[-1]
    assert steps[0]["verification"] is None  # the prefill's token verifies nothing
    verifications = [step["verification"] for step in steps[1:]]
    assert [v["proposed"][0]["is_accepted"] for v in verifications] == [
        c == p for c, p in zip("ello there", "ello thEre")
    ]
    assert verifications[0] == {
        "source": "prediction",
        "proposed": [{"token_id": ord("e"), "piece": "e", "draft_prob": 1.0, "prob": 1.0, "is_accepted": True}],
        "num_accepted": 1,
        "position": 0,
    }
    assert finished["type"] == "generation.finished"
    expected = {"num_proposed_tokens": 10, "num_accepted_tokens": 9, "speculative_speedup": 1.5}
    assert {k: finished["stats"][k] for k in SPECULATION} == expected
    row = Generation.objects.get(pk=queued.generation_id)
    assert row.steps == steps  # the saved records are the published ones
    saved = generation_json(row)
    assert {k: saved["stats"][k] for k in SPECULATION} == expected
    assert saved["params"]["prediction"] == "Hello thEre"


def test_a_request_without_speculation_reports_none(owner: str) -> None:
    queued = submit.generate(owner, {"content": "Hi!"})
    events = run(queued.generation_id, FakeEngine("Hi"))
    assert all(step["verification"] is None for step in steps_of(events))
    assert {k: events[-1]["stats"][k] for k in SPECULATION} == {
        "num_proposed_tokens": 0,
        "num_accepted_tokens": 0,
        "speculative_speedup": 1.0,
    }


def test_a_draft_the_engine_lacks_ends_the_generation_with_invalid_params(
    owner: str, bundled_model: LanguageModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The web side allows another enabled model record; the engine has the last word (here the
    worker attached nothing: the engine's own check at `add` refuses it)."""
    monkeypatch.setattr(engines, "attach_draft", lambda engine, model, speculative: None)
    other = "Qwen2.5-Coder-0.5B-Instruct (bundled)"
    content = {"content": "Hi!", "model_id": bundled_model.pk, "overrides": {"speculative": other}}
    queued = submit.generate(owner, content)
    events = run(queued.generation_id, FakeEngine("Hi"))
    error = events[-1]
    assert (error["type"], error["code"]) == ("generation.error", "invalid_params")
    assert error["message"].startswith(f"speculative={other!r} is not a draft model of this engine")
    row = Generation.objects.get(pk=queued.generation_id)
    assert (row.status, row.error_code) == ("error", "invalid_params")
