"""Sends a generation's events to its channel-layer group, coalescing token steps.

Owns: the flush policy (a stream's first step at once, then a message every `max_steps` steps
or at the stream's next flush instant, whichever comes first: the instants are multiples of a
delay that grows with the number of streams the worker serves, `flush_delay_s`, so all of a
worker's streams flush together) and the sync -> async bridge of the worker: one event loop on
its own thread for every channel-layer send of the process (`group_send`), which sends what the
threads handed in while its last batch was on its way as one batch (`coord.layer`: two Redis
round trips for the lot, where channels_redis takes four per message). asgiref's
`async_to_sync`, called from a thread without a loop, made a new loop and a new thread for each
call, and channels_redis keeps its connections per loop: every message opened, used and closed
a Redis connection of its own (about a tenth of a worker's CPU under 8 clients, and the engine
thread waited for it on each serving-view message). Must not know: the engine, the ORM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from channels.layers import get_channel_layer

from playground import protocol

logger = logging.getLogger(__name__)


def group_send(group: str, message: dict[str, Any]) -> concurrent.futures.Future:
    """Starts sending `message` to `group` and returns at once; the future holds how it went
    (the channel layer's own exceptions, e.g. Redis' ConnectionError). What the process's
    threads hand in while a batch is on its way goes out as the next batch, in two round trips
    (`coord.layer`'s `group_send_many`): a worker's streams flush at the same instants."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    sender = _sender()
    sender.loop.call_soon_threadsafe(sender.add, group, message, future)
    return future


class _Sender:
    """A process's sending loop and the sends handed to it and not sent yet (touched on that
    loop only)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="channel-layer", daemon=True).start()
        self.pending: list[tuple[str, dict[str, Any], concurrent.futures.Future]] = []
        self.is_sending = False

    def add(self, group: str, message: dict[str, Any], future: concurrent.futures.Future) -> None:
        self.pending.append((group, message, future))
        if not self.is_sending:
            self.is_sending = True
            self.loop.create_task(self._send_pending())

    async def _send_pending(self) -> None:
        try:
            while self.pending:
                batch, self.pending = self.pending, []
                layer = get_channel_layer()
                if not hasattr(layer, "group_send_many"):  # a layer without batches (the tests' in-memory one)
                    await _send_each(batch)
                    continue
                try:
                    await layer.group_send_many([(group, message) for group, message, _ in batch])
                except (redis.RedisError, OSError) as exc:  # Redis: every send of the batch is lost
                    for *_, future in batch:
                        future.set_exception(exc)
                except Exception:  # before anything went out (a message msgpack refuses): each on its own
                    await _send_each(batch)
                else:
                    for *_, future in batch:
                        future.set_result(None)
        finally:
            self.is_sending = False


async def _send_each(batch: list[tuple[str, dict[str, Any], concurrent.futures.Future]]) -> None:
    """One at a time: one stream's broken message fails that stream's send, not its batch's."""
    for group, message, future in batch:
        try:
            await get_channel_layer().group_send(group, message)
        except Exception as exc:
            future.set_exception(exc)
        else:
            future.set_result(None)


_sender_lock = threading.Lock()
_sender_of_pid: dict[int, _Sender] = {}  # a forked child makes its own


def _sender() -> _Sender:
    """The process's sender, started on first use (the model-free web process never starts one)."""
    with _sender_lock:
        sender = _sender_of_pid.get(os.getpid())
        if sender is None or sender.loop.is_closed():
            sender = _Sender()
            _sender_of_pid.clear()
            _sender_of_pid[os.getpid()] = sender
        return sender


# Progress reports that another event of the same stream always follows: handed on without
# waiting for Redis, so the first token's message is not held behind the round trip of the
# `generation.prefilled` just before it (4-9 ms of a lone request's first token). The order
# holds (one sending loop sends in the order handed in); a lost Redis fails the next send too.
UNAWAITED_TYPES = frozenset({"generation.prefilled", "generation.waiting"})


def send_to_group(event: dict[str, Any]) -> None:
    """Publishes one event to the group of the generation it names (from sync code), and waits
    until it is sent (but for UNAWAITED_TYPES): a generation's events keep their order, and a
    lost Redis raises here."""
    future = group_send(protocol.group_name(event["generation_id"]), event)
    if event["type"] in UNAWAITED_TYPES:
        future.add_done_callback(_log_failure)
    else:
        future.result()


def _log_failure(future: concurrent.futures.Future) -> None:
    if (exc := future.exception()) is not None:
        logger.warning("an unawaited event was not sent: %s", exc)


MIN_DELAY_S = 0.05  # one stream: ~20 messages a second, smooth to read
MAX_DELAY_S = 0.25  # many streams: each still moves four times a second
MESSAGES_PER_S = 40.0  # what a worker sends at most (above MIN_DELAY_S's streams)
MAX_STEPS = 32  # steps in a message at most (with their top-20: ~150 KB)


def flush_delay_s(num_streams: int) -> float:
    """How long a stream's steps wait to go out together when the worker serves `num_streams`.

    Each message costs the web process, Redis and this process's sending loop about 2 ms of CPU
    together (8 clients on 2 cores: 1.3 ms in daphne alone), taken from the cores the forward
    pass needs. A fixed delay sent one message per stream per step, so the cost grew with the
    batch; spreading ~MESSAGES_PER_S over the streams keeps it flat."""
    return min(MAX_DELAY_S, max(MIN_DELAY_S, num_streams / MESSAGES_PER_S))


class StepCoalescer:
    """Buffers step records and hands them on in batches.

    The first step goes at once (the time to first token is what a user waits for). After it,
    the next message is due at a flush instant reckoned from the last message rather than the
    first buffered step (`flush_due_at`), so a slow model (one token per second) still shows
    each token as it arrives. `max_delay_s`: seconds, or a function giving them (read at each
    step: the worker's load changes). `max_steps` only bounds a message's size (MAX_STEPS): at 8
    it sent a message every 8 steps once a batch of 8 stepped in 20 ms, more often than
    `flush_delay_s` meant to.
    """

    def __init__(
        self,
        flush: Callable[[list[Any]], None],
        max_steps: int = MAX_STEPS,
        max_delay_s: float | Callable[[], float] = MIN_DELAY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._flush, self.max_steps, self._clock = flush, max_steps, clock
        self._delay_s = max_delay_s if callable(max_delay_s) else lambda: max_delay_s
        self._buffer: list[Any] = []
        self._last_flush = clock()
        self._is_first = True

    def add(self, step: Any) -> None:
        self._buffer.append(step)
        # (1 ns of slack: an instant is a multiple computed in floating point, 3 * 0.2 > 0.6)
        if self._is_first or len(self._buffer) >= self.max_steps or self._clock() >= self._due_at() - 1e-9:
            self._is_first = False
            self.flush()

    def flush_due_at(self) -> float | None:
        """When the next message goes out at the latest, on the coalescer's clock: whoever reads
        the steps may let them wait until then. None while the next step goes at once (the first)."""
        return None if self._is_first else self._due_at()

    def _due_at(self) -> float:
        """The first multiple of the delay after half a delay since the last message (between
        half a delay and one and a half after it, one on average): every stream of a worker
        flushes at the same instants, so their messages go out in one batch (`group_send`)."""
        delay_s = self._delay_s()
        return (math.floor((self._last_flush + delay_s / 2) / delay_s) + 1) * delay_s

    def flush(self) -> None:
        """Hands on what is buffered (call before the terminal event)."""
        if self._buffer:
            steps, self._buffer = self._buffer, []
            self._flush(steps)
        self._last_flush = self._clock()
