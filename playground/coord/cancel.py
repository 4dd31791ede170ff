"""Cancel requests (a user's stop, not a stop string): a flag in Redis that the consumer sets
and the worker's engine loop reads for its whole batch in one round trip (`cancelled_among`), on
a thread of its own every 50 ms (`ServeLoop`'s cancel watch).

A flag rather than a Celery revoke: the generation runs inside the engine loop, which applies
the stops found between steps, so a stop takes effect within 50 ms and one step.

A worker that gives up on a generation itself (it can no longer publish it: Redis is gone) sets
a flag in its own process (`cancel_here`), which the same check reads; while Redis is
unreachable the check answers from those alone (one warning per outage, not one per step).
"""

from __future__ import annotations

import logging
import threading
import time

from playground.coord import keys, store

logger = logging.getLogger(__name__)

_TTL_S = 3600  # long enough to outlive any queue wait; short enough not to pile up
_LOCAL_TTL_S = 600.0  # a local flag outlives its request's last step by far

_local_lock = threading.Lock()
_cancelled_here: dict[int, float] = {}  # generation id -> when this process asked
_is_redis_down = False


def _key(generation_id: int) -> str:
    return keys.cancel_requested(generation_id)


def request_cancel(generation_id: int) -> None:
    store.client().set(_key(generation_id), 1, ex=_TTL_S)


def is_cancel_requested(generation_id: int) -> bool:
    return bool(store.client().exists(_key(generation_id)))


def clear(generation_id: int) -> None:
    store.client().delete(_key(generation_id))


def cancel_here(generation_id: int) -> None:
    """Stops a generation that this process runs, without Redis (read, once, by `cancelled_among`)."""
    with _local_lock:
        _cancelled_here[generation_id] = time.monotonic()


def cancelled_among(generation_ids: list[int]) -> set[int]:
    """Which of these generations a user (or this process) asked to cancel: one round trip for
    a whole batch."""
    global _is_redis_down
    if not generation_ids:
        return set()
    with _local_lock:
        now = time.monotonic()
        here = {g for g in generation_ids if g in _cancelled_here}
        for generation_id in [g for g, at in _cancelled_here.items() if g in here or now - at > _LOCAL_TTL_S]:
            del _cancelled_here[generation_id]  # reported (its request gets cancelled now), or never seen
    try:
        with store.client().pipeline(transaction=False) as pipe:
            for generation_id in generation_ids:
                pipe.exists(_key(generation_id))
            flagged = {g for g, exists in zip(generation_ids, pipe.execute()) if exists}
    except store.OUTAGE_ERRORS as exc:
        if not _is_redis_down:
            logger.warning("cancel check: Redis is unreachable (%s); only this process's own stops apply", exc)
        _is_redis_down = True
        return here
    if _is_redis_down:
        logger.info("cancel check: Redis answers again")
        _is_redis_down = False
    return here | flagged
