"""Step coalescing: a message every few steps or a few ms, whichever comes first."""

from __future__ import annotations

from playground.worker.publisher import StepCoalescer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(max_steps: int = 3, max_delay_s: float = 0.05) -> tuple[StepCoalescer, list[list[int]], FakeClock]:
    batches: list[list[int]] = []
    clock = FakeClock()
    coalescer = StepCoalescer(lambda steps: batches.append([s["index"] for s in steps]), max_steps, max_delay_s, clock)
    return coalescer, batches, clock


def test_fast_steps_go_out_in_batches_of_max_steps() -> None:
    coalescer, batches, _ = make()
    for index in range(7):
        coalescer.add({"index": index})
    assert batches == [[0, 1, 2], [3, 4, 5]]
    coalescer.flush()
    assert batches == [[0, 1, 2], [3, 4, 5], [6]]


def test_slow_steps_go_out_one_by_one() -> None:
    coalescer, batches, clock = make()
    for index in range(3):
        clock.now += 0.2
        coalescer.add({"index": index})
    assert batches == [[0], [1], [2]]


def test_the_delay_counts_from_the_last_message() -> None:
    coalescer, batches, clock = make(max_steps=10)
    clock.now = 0.01
    coalescer.add({"index": 0})
    clock.now = 0.04
    coalescer.add({"index": 1})
    assert batches == []
    clock.now = 0.06
    coalescer.add({"index": 2})
    assert batches == [[0, 1, 2]]


def test_flushing_nothing_sends_nothing() -> None:
    coalescer, batches, _ = make()
    coalescer.flush()
    assert batches == []
