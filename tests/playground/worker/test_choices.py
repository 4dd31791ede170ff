"""The worker side of `n` choices with a fake engine: one unit, the prompt built once, each
choice its own sequence and its own single terminal event, on success, refusal and stop."""

from __future__ import annotations

from typing import Any

import pytest

from inference.sampling_params import MAX_SEED, SamplingParams
from playground.choices import choice_params
from playground.coord import cancel
from playground.models import Generation
from playground.protocol import is_terminal
from playground.web import owners, submit
from playground.worker import choices
from tests.playground.fake_engine import FakeEngine

# Choices after the first run in threads of their own, with their own database connections.
pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

MESSAGES = [{"role": "user", "content": "Hi!"}]


def queue_choices(num_choices: int, **overrides: Any) -> list[int]:
    content = {"overrides": {"max_new_tokens": 8, "seed": 5, "temperature": 0.7, **overrides}}
    return [
        q.generation_id
        for q in submit.api_chat(owners.LOCAL_API_OWNER, content, MESSAGES, num_choices, max_concurrent=4)
    ]


def run(generation_ids: list[int], engine: FakeEngine) -> dict[int, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    choices.run_choices(generation_ids, "worker-1", load_engine=lambda model: engine, send=events.append)
    return {gid: [e for e in events if e["generation_id"] == gid] for gid in generation_ids}


def test_the_choices_of_one_prompt_run_as_one_unit() -> None:
    ids = queue_choices(3)
    engine = FakeEngine("Hello")
    events = run(ids, engine)
    assert len(engine.rendered) == 1  # the prompt was built once
    rows = list(Generation.objects.filter(pk__in=ids).order_by("pk"))
    assert [row.status for row in rows] == ["finished"] * 3 and {row.text for row in rows} == {"Hello"}
    assert len({row.prompt_text for row in rows}) == 1 and rows[0].prompt_text
    assert [row.params["seed"] for row in rows] == [5, 6, 7]
    for gid in ids:
        types = [e["type"] for e in events[gid]]
        assert types[0] == "generation.started" and types.count("generation.started") == 1
        assert [is_terminal(e) for e in events[gid]].count(True) == 1 and types[-1] == "generation.finished"
        stats = events[gid][-1]["stats"]
        assert stats["num_generated_tokens"] == 5 and stats["stream_decode_ms"] >= 0


def test_the_seeds_of_choices_wrap_within_what_a_browser_reads_exactly() -> None:
    params = SamplingParams(seed=MAX_SEED - 1, temperature=0.7)
    assert [choice_params(params, i).seed for i in range(3)] == [MAX_SEED - 1, MAX_SEED, 0]


def test_a_prompt_the_worker_refuses_ends_every_choice_with_the_error() -> None:
    ids = queue_choices(2)
    events = run(ids, FakeEngine("Hello", max_context=4))
    for gid in ids:
        assert [e["type"] for e in events[gid]] == ["generation.error"]
        assert events[gid][0]["code"] == "prompt_too_long"
    assert set(Generation.objects.filter(pk__in=ids).values_list("error_code", flat=True)) == {"prompt_too_long"}


def test_a_unit_whose_client_left_while_queued_runs_no_choice() -> None:
    ids = queue_choices(3, max_new_tokens=50, ignore_eos=True)
    submit.cancel_generation(ids[1])  # its client went away while the unit waited for a worker
    events = run(ids, FakeEngine("x" * 50))
    assert events[ids[1]] == []  # no longer queued: not run
    for gid in (ids[0], ids[2]):
        assert events[gid][-1]["finish_reason"] == "cancelled"
        assert len(Generation.objects.get(pk=gid).text) < 50
    assert not any(cancel.is_cancel_requested(gid) for gid in ids)  # the flags are cleared after
