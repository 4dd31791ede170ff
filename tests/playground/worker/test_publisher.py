"""Step coalescing (a message every few steps or a few ms, whichever comes first) and the
worker's one sending loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

from playground import protocol
from playground.coord import store
from playground.worker import serving_view
from playground.worker.publisher import (
    MAX_DELAY_S,
    MIN_DELAY_S,
    StepCoalescer,
    flush_delay_s,
    group_send,
    send_to_group,
)


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


def test_the_first_step_goes_at_once_then_fast_steps_go_out_in_batches_of_max_steps() -> None:
    coalescer, batches, _ = make()
    for index in range(8):
        coalescer.add({"index": index})
    assert batches == [[0], [1, 2, 3], [4, 5, 6]]
    coalescer.flush()
    assert batches == [[0], [1, 2, 3], [4, 5, 6], [7]]


def test_a_fast_batchs_stream_goes_out_by_its_delay_not_every_few_steps() -> None:
    """Eight streams stepping every 20 ms: one message per stream per `flush_delay_s(8)` (0.2 s),
    as the worker's message budget means, not one every 8 steps (160 ms)."""
    batches: list[list[int]] = []
    clock = FakeClock()
    coalescer = StepCoalescer(
        lambda steps: batches.append([s["index"] for s in steps]), max_delay_s=flush_delay_s(8), clock=clock
    )
    for index in range(21):
        clock.now = index * 0.02
        coalescer.add({"index": index})
    assert [len(batch) for batch in batches] == [1, 10, 10]


def test_slow_steps_go_out_one_by_one() -> None:
    coalescer, batches, clock = make()
    for index in range(3):
        clock.now += 0.2
        coalescer.add({"index": index})
    assert batches == [[0], [1], [2]]


def test_the_delay_counts_from_the_last_message() -> None:
    coalescer, batches, clock = make(max_steps=10)
    coalescer.add({"index": -1})  # the first step, sent at once at t=0
    clock.now = 0.01
    coalescer.add({"index": 0})
    clock.now = 0.04
    coalescer.add({"index": 1})
    assert batches == [[-1]]
    clock.now = 0.06
    coalescer.add({"index": 2})
    assert batches == [[-1], [0, 1, 2]]


def test_the_next_message_is_due_a_delay_after_the_last_one_and_the_first_step_at_once() -> None:
    """What a task thread may sleep until before reading its steps (serve_loop.Outbox.hold_until)."""
    coalescer, batches, clock = make(max_steps=10)
    assert coalescer.flush_due_at() is None  # the first step goes as it comes
    clock.now = 1.0
    coalescer.add({"index": 0})
    assert batches == [[0]] and coalescer.flush_due_at() == 1.05
    clock.now = 1.05
    coalescer.add({"index": 1})  # due: it goes with whatever piled up
    assert batches == [[0], [1]] and coalescer.flush_due_at() == 1.1


def test_the_delay_is_read_at_each_step_and_grows_with_the_streams_served() -> None:
    num_streams = [1]
    batches: list[list[int]] = []
    clock = FakeClock()
    coalescer = StepCoalescer(
        lambda steps: batches.append([s["index"] for s in steps]), 100, lambda: flush_delay_s(num_streams[0]), clock
    )
    coalescer.add({"index": 0})
    clock.now = 0.06  # past one stream's delay
    coalescer.add({"index": 1})
    num_streams[0] = 8
    clock.now = 0.12  # 60 ms since the last message: eight streams wait longer
    coalescer.add({"index": 2})
    assert batches == [[0], [1]]
    clock.now = 0.06 + flush_delay_s(8)
    coalescer.add({"index": 3})
    assert batches == [[0], [1], [2, 3]]
    assert flush_delay_s(1) == MIN_DELAY_S < flush_delay_s(8) < flush_delay_s(16) <= flush_delay_s(1000) == MAX_DELAY_S


def test_flushing_nothing_sends_nothing() -> None:
    coalescer, batches, _ = make()
    coalescer.flush()
    assert batches == []


def test_a_workers_sends_share_one_redis_connection_whatever_thread_sends(settings, redis_url) -> None:
    """asgiref's async_to_sync made a new event loop per send, and channels_redis a new
    connection per loop: every published message connected to Redis again."""
    settings.CHANNEL_LAYERS = {
        "default": {"BACKEND": "playground.coord.layer.RedisChannelLayer", "CONFIG": {"hosts": [redis_url]}}
    }
    send_to_group({"type": "generation.started", "generation_id": 1})  # the first send connects
    connections_before = store.client().info("stats")["total_connections_received"]
    for generation_id in range(6):  # one after another (sends at once may each need a connection of the pool)
        sender = threading.Thread(target=send_to_group, args=({"type": "x", "generation_id": generation_id},))
        sender.start()
        sender.join(timeout=30)
    assert store.client().info("stats")["total_connections_received"] - connections_before <= 1


def test_the_serving_view_never_waits_for_a_send_still_on_its_way(monkeypatch) -> None:
    sends: list[concurrent.futures.Future] = []

    def never_finishing_send(group: str, message: dict) -> concurrent.futures.Future:
        sends.append(concurrent.futures.Future())
        return sends[-1]

    monkeypatch.setattr(serving_view, "group_send", never_finishing_send)
    monkeypatch.setattr(serving_view, "_state", {"last_sent": 0.0, "num_skipped": 0, "in_flight": None})
    monkeypatch.setattr(serving_view, "serving_step", lambda step, generation_of, worker, num_skipped: {})
    serving_view.publish(None, {}, "w")  # handed over, not awaited (Redis is slow)
    serving_view._state["last_sent"] = 0.0  # the throttle allows the next one...
    serving_view.publish(None, {}, "w")  # ...but the last one is still on its way: skipped
    assert len(sends) == 1 and serving_view._state["num_skipped"] == 1
    sends[0].set_result(None)
    serving_view._state["last_sent"] = 0.0
    serving_view.publish(None, {}, "w")
    assert len(sends) == 2 and serving_view._state["num_skipped"] == 0


def test_streams_flush_at_the_same_instants_whenever_they_started() -> None:
    """Each stream's next message is due at the first multiple of the delay past half a delay
    after its last one: a worker's streams send together, so their messages share a batch."""
    clock = FakeClock()
    coalescers = [StepCoalescer(lambda steps: None, 100, 0.2, clock) for _ in range(3)]
    for started_at, coalescer in zip((0.0, 0.07, 0.13), coalescers):
        clock.now = started_at
        coalescer.add({"index": 0})  # its first step: sent at once
    assert [round(c.flush_due_at(), 6) for c in coalescers] == [0.2, 0.2, 0.4]  # 0.13 + 0.1 is past 0.2
    for due in (0.2, 0.4, 0.6):
        clock.now = due
        for coalescer in coalescers:
            if round(coalescer.flush_due_at(), 6) <= due:
                coalescer.add({"index": 1})
        assert {round(c.flush_due_at(), 6) for c in coalescers} == {round(due + 0.2, 6)}


class BatchRecordingLayer:
    """A layer whose first batch waits until released; records each batch's groups."""

    batches: list[list[str]] = []
    sent: list[str] = []
    released = threading.Event()
    fails = False

    async def group_send_many(self, sends: list[tuple[str, dict]]) -> None:
        self.batches.append([group for group, _ in sends])
        while not self.released.is_set():
            await asyncio.sleep(0.005)
        if self.fails:
            raise ConnectionError("Redis is gone")
        if any("broken" in message for _, message in sends):
            raise TypeError("can not serialize 'object' object")  # as msgpack would, before sending
        self.sent.extend(group for group, _ in sends)

    async def group_send(self, group: str, message: dict) -> None:
        if "broken" in message:
            raise TypeError("can not serialize 'object' object")
        self.sent.append(group)


def test_what_threads_hand_in_while_a_batch_is_on_its_way_goes_out_as_one_batch(settings) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.BatchRecordingLayer"}}
    BatchRecordingLayer.batches, BatchRecordingLayer.fails = [], False
    BatchRecordingLayer.released.clear()
    first = group_send("g0", {"type": "x"})
    while not BatchRecordingLayer.batches:  # the first batch is on its way (and waits)
        threading.Event().wait(0.005)
    futures = [group_send(f"g{i}", {"type": "x"}) for i in range(1, 6)]
    BatchRecordingLayer.released.set()
    for future in [first, *futures]:
        future.result(timeout=10)
    assert BatchRecordingLayer.batches == [["g0"], ["g1", "g2", "g3", "g4", "g5"]]


def test_a_failed_batch_fails_every_send_in_it(settings) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.BatchRecordingLayer"}}
    BatchRecordingLayer.batches, BatchRecordingLayer.fails = [], True
    BatchRecordingLayer.released.set()
    futures = [group_send(f"g{i}", {"type": "x"}) for i in range(3)]
    for future in futures:
        try:
            future.result(timeout=10)
            raise AssertionError("a send of a failed batch succeeded")
        except ConnectionError:
            pass


def test_a_message_that_cannot_be_sent_fails_its_own_stream_not_the_others_of_its_batch(settings) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.BatchRecordingLayer"}}
    BatchRecordingLayer.batches, BatchRecordingLayer.sent, BatchRecordingLayer.fails = [], [], False
    BatchRecordingLayer.released.clear()
    first = group_send("g0", {"type": "x"})
    while not BatchRecordingLayer.batches:  # the next three wait for it: one batch
        threading.Event().wait(0.005)
    futures = [group_send(f"g{i}", {"type": "x", **({"broken": object()} if i == 2 else {})}) for i in range(1, 4)]
    BatchRecordingLayer.released.set()
    first.result(timeout=10)
    futures[0].result(timeout=10), futures[2].result(timeout=10)
    try:
        futures[1].result(timeout=10)
        raise AssertionError("the broken message was sent")
    except TypeError:
        pass
    assert BatchRecordingLayer.batches[1] == ["g1", "g2", "g3"] and BatchRecordingLayer.sent == ["g0", "g1", "g3"]


def test_a_prefilled_report_is_not_waited_for_and_keeps_its_place_before_the_first_token(settings) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": f"{__name__}.BatchRecordingLayer"}}
    BatchRecordingLayer.batches, BatchRecordingLayer.sent, BatchRecordingLayer.fails = [], [], False
    BatchRecordingLayer.released.clear()

    def sent_in_thread(event: dict) -> threading.Event:
        done = threading.Event()
        threading.Thread(target=lambda: (send_to_group(event), done.set()), daemon=True).start()
        return done

    prefilled = sent_in_thread({"type": "generation.prefilled", "generation_id": 7})
    assert prefilled.wait(5)  # returned while Redis (the gate) has not taken it
    tokens = sent_in_thread({"type": "generation.tokens", "generation_id": 8})
    assert not tokens.wait(0.2)  # a step's message waits until it is sent
    BatchRecordingLayer.released.set()
    assert tokens.wait(10)
    assert BatchRecordingLayer.sent == [protocol.group_name(7), protocol.group_name(8)]
