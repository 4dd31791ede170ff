"""A prompt is built on its generation's own thread: the engine's thread keeps stepping the
batch meanwhile (a long chat's render and tokenization take tens of milliseconds)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from playground.protocol import is_terminal
from playground.web import submit
from playground.worker import generation
from tests.playground.fake_engine import FakeEngine, run_on_a_thread

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)  # one run is on another thread


def test_the_batch_keeps_stepping_while_a_new_prompt_is_built(owner: str) -> None:
    steps_run: list[int] = []
    engine = FakeEngine("y" * 400, on_step=lambda index: (steps_run.append(index), time.sleep(0.005)))
    first = submit.generate(owner, {"content": "Hi!", "overrides": {"max_new_tokens": 500}})
    running, first_events = run_on_a_thread(first.generation_id, engine, steps_run)

    build, steps_during_build = engine.prompts.build, []

    def slow_build(**kwargs: Any):  # a build that lasts until the batch has stepped three times
        before, until = len(steps_run), time.monotonic() + 10
        while len(steps_run) < before + 3 and time.monotonic() < until:
            time.sleep(0.005)
        steps_during_build.append(len(steps_run) - before)
        return build(**kwargs)

    engine.prompts.build = slow_build
    second = submit.generate(owner, {"content": "And you?", "overrides": {"max_new_tokens": 5}})
    second_events: list[dict[str, Any]] = []
    generation.run_generation(
        second.generation_id, "worker-1", load_engine=lambda model: engine, send=second_events.append
    )
    running.join(timeout=30)

    assert steps_during_build and steps_during_build[0] >= 3  # on the loop thread: none (a 10 s stall)
    assert second_events[-1]["type"] == "generation.finished" and second_events[-1]["text"] == "yyyyy"
    assert not running.is_alive() and [e["type"] for e in first_events if is_terminal(e)] == ["generation.finished"]
