"""The worker's engine loop: task threads submit at once and each gets its own events; the
cancel check, the waiting position and a failing step, on a real tiny batching engine."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from inference import EngineConfig, Finished, SamplingParams, Step
from inference.bench.stack import ENGINE_THREADS
from inference.engine import Engine
from playground.worker.serve_loop import ENGINE_THREAD_NAME, LoopFailed, Outbox, ServeLoop, Waiting
from tests.inference.engines import engine_for

PARAMS = SamplingParams(greedy=True, max_new_tokens=8, ignore_eos=True, use_prefix_cache=False)


def prompt(i: int) -> list[int]:
    return [5 + (i * 11 + j) % 150 for j in range(4 + 3 * i)]


def tokens(events: list) -> list[int]:
    return [e.token_id for e in events if isinstance(e, Step)]


def never_cancelled(generation_ids: list[int]) -> set[int]:
    return set()


def test_threads_submit_at_once_and_each_gets_exactly_its_own_answer() -> None:
    engine = engine_for("llama")
    expected = {i: tokens(engine.generate(prompt(i), PARAMS)) for i in range(6)}
    loop = ServeLoop(engine, never_cancelled)
    results: dict[int, list] = {}

    def run(i: int) -> None:
        results[i] = list(loop.submit(prompt(i), PARAMS, generation_id=100 + i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for i in range(6):
        assert tokens(results[i]) == expected[i]
        assert [type(e) for e in results[i]].count(Finished) == 1 and isinstance(results[i][-1], Finished)
    assert loop.num_requests == 0


class PacedStop:
    """A cancel check that flags `generation_id` once the engine has taken `at_step` steps, and
    holds the engine's next step until the check has said so. The loop cannot finish the doomed
    answer before the stop is seen, however the machine schedules the threads: with the flag set
    by the reader, a loaded machine let the loop run all 200 steps before the reader took two."""

    def __init__(self, engine: Engine, generation_id: int, at_step: int) -> None:
        self.generation_id = generation_id
        self.is_due = threading.Event()
        self.is_reported = threading.Event()
        real_step, num_steps = engine.step, 0

        def step() -> list:
            nonlocal num_steps
            if self.is_due.is_set():
                assert self.is_reported.wait(10.0), "the cancel watch never read the stop"
            events = real_step()
            num_steps += 1
            if num_steps == at_step:
                self.is_due.set()
            return events

        engine.step = step

    def __call__(self, generation_ids: list[int]) -> set[int]:
        if self.is_due.is_set() and self.generation_id in generation_ids:
            self.is_reported.set()
            return {self.generation_id}
        return set()


LONG = SamplingParams(greedy=True, max_new_tokens=200, ignore_eos=True, use_prefix_cache=False)


def test_the_cancel_check_ends_only_the_flagged_generation() -> None:
    engine = engine_for("llama")
    loop = ServeLoop(engine, PacedStop(engine, generation_id=7, at_step=3))
    doomed = loop.submit(prompt(1), LONG, generation_id=7)
    other = loop.submit(prompt(2), PARAMS, generation_id=8)
    seen = list(doomed)
    assert seen[-1].finish_reason == "cancelled" and 2 <= len(tokens(seen)) < 200
    assert list(other)[-1].finish_reason == "length"


def test_a_request_without_room_in_the_batch_is_told_its_place() -> None:
    model_engine = engine_for("llama")
    engine = Engine(model_engine.loaded, EngineConfig(max_num_seqs=1))
    loop = ServeLoop(engine, never_cancelled)
    # The first is long and its prefill is read before the second is submitted: a short one
    # could finish on a loaded machine before the second arrives, which then never waits.
    long = replace(PARAMS, max_new_tokens=64)
    first = loop.submit(prompt(1), long, generation_id=1)
    assert next(first).type == "prefilled"
    second = loop.submit(prompt(2), PARAMS, generation_id=2)
    events = list(second)
    waiting = [e for e in events if isinstance(e, Waiting)]
    assert waiting and waiting[0].position == 1 and waiting[0].num_waiting == 1
    assert list(first)[-1].finish_reason == "length" and events[-1].finish_reason == "length"
    assert events[[type(e) for e in events].index(Finished)].queue_ms > 0


def test_a_failing_forward_pass_ends_its_requests_with_an_error_and_the_loop_serves_on() -> None:
    engine = engine_for("llama")
    loop = ServeLoop(engine, never_cancelled)
    real_run = engine.runner.run
    engine.runner.run = lambda *args: (_ for _ in ()).throw(RuntimeError("boom"))
    finished = list(loop.submit(prompt(1), PARAMS, generation_id=1))[-1]
    assert finished.finish_reason == "error" and "boom" in finished.error
    engine.runner.run = real_run
    assert list(loop.submit(prompt(1), PARAMS, generation_id=2))[-1].finish_reason == "length"


def test_a_failing_engine_step_ends_every_request_with_an_error_and_the_loop_serves_on() -> None:
    engine = engine_for("llama")
    loop = ServeLoop(engine, never_cancelled)
    real_step = engine.core.step
    engine.core.step = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    events = loop.submit(prompt(1), PARAMS, generation_id=1)
    with pytest.raises(LoopFailed, match="boom"):
        list(events)
    engine.core.step = real_step
    assert list(loop.submit(prompt(1), PARAMS, generation_id=2))[-1].finish_reason == "length"


def test_bad_input_is_refused_at_submit() -> None:
    loop = ServeLoop(engine_for("llama"), never_cancelled)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        loop.submit([10**9], PARAMS, generation_id=1)
    assert loop.num_requests == 0


def test_parallel_choices_are_one_unit_each_with_its_own_seed() -> None:
    """`n` choices of one prompt: added together, each sampled with the seed + its index, each
    equal to that seed's request alone; a bad prompt adds none of them."""
    engine = engine_for("llama")
    sampled = SamplingParams(temperature=1.0, max_new_tokens=6, ignore_eos=True, seed=41, use_prefix_cache=False)
    alone = [tokens(engine.generate(prompt(2), replace(sampled, seed=41 + i))) for i in range(3)]
    loop = ServeLoop(engine, never_cancelled)
    streams = loop.submit_parallel(prompt(2), sampled, [7, 8, 9])
    assert loop.num_requests == 3
    results = [list(events) for events in streams]
    assert [tokens(r) for r in results] == alone and len({tuple(a) for a in alone}) > 1
    assert all(isinstance(r[-1], Finished) and r[-1].seed == 41 + i for i, r in enumerate(results))
    assert loop.num_requests == 0
    with pytest.raises(ValueError, match="outside the vocabulary"):
        loop.submit_parallel([10**9], sampled, [10, 11])
    assert loop.num_requests == 0


def test_a_parallel_choice_that_is_stopped_ends_alone() -> None:
    engine = engine_for("llama")
    loop = ServeLoop(engine, PacedStop(engine, generation_id=5, at_step=3))
    doomed, other = loop.submit_parallel(prompt(1), LONG, [5, 6])
    seen = list(doomed)
    assert seen[-1].finish_reason == "cancelled" and 2 <= len(tokens(seen)) < 200
    assert list(other)[-1].finish_reason == "length"


def _step(index: int) -> SimpleNamespace:
    return SimpleNamespace(type="step", index=index)


HANDED_OFF = SimpleNamespace(type="handed_off")  # a prefill-only request's terminal record


def _put_later(outbox: Outbox, items: list, every_s: float) -> threading.Thread:
    def put() -> None:
        for item in items:
            time.sleep(every_s)
            outbox.put(item)

    thread = threading.Thread(target=put)
    thread.start()
    return thread


def test_a_holding_reader_takes_the_steps_that_piled_up_in_one_wake() -> None:
    """`hold_until`: the task thread sleeps until its next message is due and then reads every
    step that came meanwhile (before: one wakeup per step and stream)."""
    outbox = Outbox()
    outbox.put(_step(0))
    assert next(outbox).index == 0  # no hold: the first step is read as it comes
    due = time.monotonic() + 0.3
    outbox.hold_until = lambda: due
    writer = _put_later(outbox, [_step(i) for i in range(1, 5)], every_s=0.02)
    assert next(outbox).index == 1
    read_at = time.monotonic()
    assert read_at >= due  # not woken by steps 1-4
    assert outbox._taken and [next(outbox).index for _ in range(3)] == [2, 3, 4]  # taken in that wake
    writer.join()


def test_a_terminal_event_or_an_error_ends_a_hold_at_once() -> None:
    for last in (HANDED_OFF, LoopFailed("the engine failed")):
        outbox = Outbox()
        outbox.hold_until = lambda: time.monotonic() + 30.0
        writer = _put_later(outbox, [_step(0), last], every_s=0.02)
        started = time.monotonic()
        assert next(outbox).index == 0
        if last is HANDED_OFF:
            assert next(outbox) is last
        else:
            with pytest.raises(LoopFailed):
                next(outbox)
        assert time.monotonic() - started < 5.0  # not the 30 s hold
        assert list(outbox) == []  # ended: nothing more, and a second loop over it ends at once
        writer.join()


def test_an_outbox_read_in_two_loops_loses_nothing_taken_in_one_wake() -> None:
    """PD decode reads up to `Prefilled` in one loop, then the rest in another."""
    outbox = Outbox()
    for item in [_step(0), _step(1), HANDED_OFF]:
        outbox.put(item)
    for event in outbox:
        assert event.index == 0
        break
    rest = list(outbox)
    assert rest == [_step(1), HANDED_OFF]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux names threads through prctl")
def test_the_loop_thread_is_named_for_the_os_so_its_cpu_counts_as_the_engines() -> None:
    loop = ServeLoop(engine_for("llama"), never_cancelled)
    list(loop.submit(prompt(1), PARAMS, generation_id=1))  # the loop has run
    comm = Path(f"/proc/self/task/{loop._thread.native_id}/comm").read_text().strip()
    assert comm == ENGINE_THREAD_NAME == "engine-loop"  # what inference.bench.stack's ENGINE_THREADS reads
    assert ENGINE_THREAD_NAME in ENGINE_THREADS


def test_an_inspection_lets_the_batch_step_between_its_chunks_and_a_new_request_join() -> None:
    """An inspection (`call_paced`) runs on the loop thread in chunks; at each of its pace points
    the batch takes a step and requests handed in meanwhile join it: a long prompt's logprobs
    hold no one's next token longer than a chunk (issue 46). Quick calls still run between steps."""
    engine = engine_for("llama")
    loop = ServeLoop(engine, never_cancelled)
    is_inspecting = threading.Event()
    real_step, num_steps = engine.step, 0

    def step() -> list:
        """The running request may not finish before the inspection starts, however the OS
        schedules the threads: from its third step the loop waits for the inspection's command."""
        nonlocal num_steps
        num_steps += 1
        while num_steps >= 3 and not is_inspecting.is_set() and loop._commands.empty():
            time.sleep(0.001)
        return real_step()

    engine.step = step
    running = loop.submit(prompt(1), replace(PARAMS, max_new_tokens=40), generation_id=1)
    first = [next(running), next(running)]  # prefilled, then its first token: it is in the batch
    engine.passes.chunk_tokens = 2
    long_text = [5 + j % 150 for j in range(60)]  # 30 chunks: 30 pace points
    answers: list = []

    def scored() -> int:
        is_inspecting.set()
        before = engine.core.num_steps
        engine.passes.score(long_text, lambda first, logits: None)
        return engine.core.num_steps - before

    inspection = threading.Thread(target=lambda: answers.append(loop.call_paced(scored)))
    inspection.start()
    assert is_inspecting.wait(timeout=30)
    joined = loop.submit(prompt(2), PARAMS, generation_id=2)  # handed in while the inspection runs
    inspection.join(timeout=60)

    assert answers == [30]  # the batch stepped at every one of the 30 pace points
    assert tokens(list(joined)) == tokens(engine_for("llama").generate(prompt(2), PARAMS))
    assert len(tokens(first + list(running))) == 40
    assert loop.call(lambda: 7) == 7
