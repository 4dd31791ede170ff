"""Sends a generation's events to its channel-layer group, coalescing token steps.

Owns: the flush policy (a message every `max_steps` steps or `max_delay_s` since the last
message, whichever comes first) and the sync -> async bridge of the worker: one event loop on
its own thread for every channel-layer send of the process (`group_send`). asgiref's
`async_to_sync`, called from a thread without a loop, made a new loop and a new thread for each
call, and channels_redis keeps its connections per loop: every message opened, used and closed
a Redis connection of its own (about a tenth of a worker's CPU under 8 clients, and the engine
thread waited for it on each serving-view message). Must not know: the engine, the ORM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from channels.layers import get_channel_layer

from playground import protocol

_loop_lock = threading.Lock()
_loop_of_pid: dict[int, asyncio.AbstractEventLoop] = {}  # a forked child makes its own


def _layer_loop() -> asyncio.AbstractEventLoop:
    """The process's sending loop, started on first use (the model-free web process never starts one)."""
    with _loop_lock:
        loop = _loop_of_pid.get(os.getpid())
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="channel-layer", daemon=True).start()
            _loop_of_pid.clear()
            _loop_of_pid[os.getpid()] = loop
        return loop


def group_send(group: str, message: dict[str, Any]) -> concurrent.futures.Future:
    """Starts sending `message` to `group` and returns at once; the future holds how it went
    (the channel layer's own exceptions, e.g. Redis' ConnectionError)."""
    return asyncio.run_coroutine_threadsafe(get_channel_layer().group_send(group, message), _layer_loop())


def send_to_group(event: dict[str, Any]) -> None:
    """Publishes one event to the group of the generation it names (from sync code), and waits
    until it is sent: a generation's events keep their order, and a lost Redis raises here."""
    group_send(protocol.group_name(event["generation_id"]), event).result()


class StepCoalescer:
    """Buffers step records and hands them on in batches.

    Measured from the last flush rather than the first buffered step, so a slow model (one
    token per second) still shows each token as it arrives.
    """

    def __init__(
        self,
        flush: Callable[[list[dict[str, Any]]], None],
        max_steps: int = 8,
        max_delay_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._flush, self.max_steps, self.max_delay_s, self._clock = flush, max_steps, max_delay_s, clock
        self._buffer: list[dict[str, Any]] = []
        self._last_flush = clock()

    def add(self, step: dict[str, Any]) -> None:
        self._buffer.append(step)
        if len(self._buffer) >= self.max_steps or self._clock() - self._last_flush >= self.max_delay_s:
            self.flush()

    def flush(self) -> None:
        """Hands on what is buffered (call before the terminal event)."""
        if self._buffer:
            steps, self._buffer = self._buffer, []
            self._flush(steps)
        self._last_flush = self._clock()
