"""Follows one generation's events over the channel layer, like the WebSocket consumer does,
for a request that holds no socket: its own channel in the generation's group, a watchdog,
and the cancel when the client goes away. A Redis outage ends the follow with what the database
says: a queued generation ends as `service_unavailable` at once, a running one when its worker
(which cannot publish either) has saved it so.

Owns: receiving (`generation.started/prefilled/tokens/finished/error`) until exactly one
terminal event, asking the watchdog (`web/following.py`, the consumer's too: a re-route of a
stranded generation, a dead worker's generation declared lost, so a stream ends with an error
instead of hanging) after each WATCH_INTERVAL_S without an event, and `close` (cancels the
generation unless it ended). Must not know: OpenAI's shapes, HTTP, the watchdog's rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from playground import protocol
from playground.coord.store import OUTAGE_ERRORS
from playground.web import following, submit

logger = logging.getLogger(__name__)


class Follower:
    def __init__(self, generation_id: int) -> None:
        self.generation_id = generation_id
        self.group = protocol.group_name(generation_id)
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self.ended = False
        # Not thread-sensitive: the events are read by a task that outlives the view which
        # started it (and with it the view's sync thread), and no transaction spans these calls.
        self.watchdog = following.Watchdog(generation_id, thread_sensitive=False)
        self._receiving: asyncio.Future[dict[str, Any]] | None = None

    async def join(self) -> None:
        """Joins the group; call before the task is queued so no event can be missed."""
        self.channel = await self.layer.new_channel("openai-api.")
        await self.layer.group_add(self.group, self.channel)

    async def events(self, tick_s: float | None = None) -> AsyncIterator[dict[str, Any] | None]:
        """The events up to and including the terminal one; None after each idle `tick_s`."""
        idle_s, watch_interval_s = 0.0, following.WATCH_INTERVAL_S
        wait_s = min(tick_s or watch_interval_s, watch_interval_s)
        while not self.ended:
            if self._receiving is None:
                self._receiving = asyncio.ensure_future(self.layer.receive(self.channel))
            done, _ = await asyncio.wait({self._receiving}, timeout=wait_s)
            if done:
                try:
                    event, idle_s = self._receiving.result(), 0.0
                except OUTAGE_ERRORS:  # Redis is gone: no event will come, the database tells the end
                    event = await following.outage_event(self.generation_id, thread_sensitive=False)
                    if event is None:
                        await asyncio.sleep(watch_interval_s)
                self._receiving = None
            else:
                event, idle_s = None, idle_s + wait_s
                if idle_s >= watch_interval_s:
                    idle_s = 0.0
                    event = await self.watchdog.tick()
            if event is not None and event.get("generation_id") != self.generation_id:
                continue
            if event is not None and protocol.is_terminal(event):
                self.ended = True
            if event is not None or tick_s is not None:
                yield event

    async def close(self) -> None:
        """Leaves the group; a generation that has not ended is cancelled (its client left)."""
        if self._receiving is not None:
            self._receiving.cancel()
            self._receiving = None
        if not self.ended:
            self.ended = True
            try:
                await database_sync_to_async(submit.cancel_generation)(self.generation_id)
                logger.info("generation %s cancelled: its API client went away", self.generation_id)
            except Exception:
                logger.exception("generation %s could not be cancelled", self.generation_id)
        if self.channel is not None:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(self.group, self.channel)
