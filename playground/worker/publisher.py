"""Sends a generation's events to its channel-layer group, coalescing token steps.

Owns: the flush policy (a message every `max_steps` steps or `max_delay_s` since the last
message, whichever comes first) and the sync -> async bridge of the worker. Must not know:
the engine, the ORM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from playground import protocol


def send_to_group(event: dict[str, Any]) -> None:
    """Publishes one event to the group of the generation it names (from sync code)."""
    async_to_sync(get_channel_layer().group_send)(protocol.group_name(event["generation_id"]), event)


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
