"""The watchdog of a followed generation: what everything that follows a generation's events
until its one terminal event does when no event comes. The WebSocket consumer
(`consumers.GenerationConsumer`) and the OpenAI API's `Follower` (`openai_api/follow.py`) both
ask this module; neither has a rule of its own.

Each WATCH_INTERVAL_S without an event of the generation (a stream that delivers is alive: with
16 streams, checking them all every second was a tenth of the web process's work), `Watchdog.check`:
- re-routes the generation if it is stranded on a dead (or stalled) worker's private queue
  (`dispatch.reroute_if_stranded`: at most once, however often it is asked). Best effort: it
  needs Redis, and its failure never keeps the database from being asked;
- asks the database whether the generation has ended (`liveness.ended_event`, which also
  declares a dead worker's generation lost) and reports that terminal event only once it has
  read "ended" NUM_ENDED_CHECKS times in a row: the worker's own event may still be on its way.
  A check that fails counts as "not ended" (the count starts again).
Redis gone (`outage_event`): a queued generation ends as `service_unavailable` at once; a running
one is reported once its worker, which cannot publish either, has saved its end.

Owns: WATCH_INTERVAL_S, NUM_ENDED_CHECKS and that decision. Must not know: sockets, HTTP, the
channel layer, OpenAI's shapes; the follower delivers what this returns and drops the worker's
own terminal event if it comes later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.db import database_sync_to_async

from playground import dispatch
from playground.coord import liveness
from playground.coord.store import OUTAGE_ERRORS

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
# The database's terminal event is reported only after it was read this many times in a row:
# the worker's own terminal event may still be on its way.
NUM_ENDED_CHECKS = 2


class Watchdog:
    """One followed generation's watchdog. `thread_sensitive=False` for a follower whose task
    outlives the sync thread of the view that started it (the OpenAI API's streams)."""

    def __init__(self, generation_id: int, *, thread_sensitive: bool = True) -> None:
        self.generation_id = generation_id
        self.thread_sensitive = thread_sensitive
        self.num_ended_checks = 0
        self.last_event_at = -float("inf")

    def saw_event(self) -> None:
        """The follower got one of the generation's events: `watch` asks nothing until
        WATCH_INTERVAL_S pass without another."""
        self.last_event_at = time.monotonic()

    def check(self) -> dict[str, Any] | None:
        """One interval's decision: the terminal event to report now, else None (keep following).
        Reads the database and Redis: call it through `tick` from async code."""
        try:
            dispatch.reroute_if_stranded(self.generation_id)
        except OUTAGE_ERRORS:
            pass  # routing needs Redis; the database check below does not
        except Exception:
            logger.exception("re-routing generation %s failed", self.generation_id)
        try:
            event = liveness.ended_event(self.generation_id)
        except Exception:
            logger.exception("watchdog of generation %s failed; retrying", self.generation_id)
            event = None
        self.num_ended_checks = self.num_ended_checks + 1 if event is not None else 0
        return event if self.num_ended_checks >= NUM_ENDED_CHECKS else None

    async def tick(self) -> dict[str, Any] | None:
        return await database_sync_to_async(self.check, thread_sensitive=self.thread_sensitive)()

    async def watch(self) -> dict[str, Any]:
        """Checks every WATCH_INTERVAL_S in which no event came (`saw_event`) until the rule
        reports; returns that terminal event. Run it as a task of its own and cancel it when the
        worker's own event arrives."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if time.monotonic() - self.last_event_at < WATCH_INTERVAL_S:
                self.num_ended_checks = 0  # "in a row" means without the worker speaking between
                continue
            event = await self.tick()
            if event is not None:
                return event


async def outage_event(generation_id: int, *, thread_sensitive: bool = True) -> dict[str, Any] | None:
    """Redis is gone, so no worker's event can reach the follower: the terminal event to report now
    (a queued generation ended here as `service_unavailable`, or one that has ended), else None
    (running: its worker saves its end, which a later call or the watchdog reports)."""
    return await database_sync_to_async(liveness.end_queued_for_outage, thread_sensitive=thread_sensitive)(
        generation_id
    )
