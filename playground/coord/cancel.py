"""Cancel requests (a user's stop, not a stop string): a flag in Redis that the consumer sets
and the worker's engine loop reads once per step for its whole batch (`cancelled_among`).

A flag rather than a Celery revoke: the generation runs inside the engine loop, which checks
the flags between steps, so a stop takes effect within one step.
"""

from __future__ import annotations

from playground.coord import keys, store

_TTL_S = 3600  # long enough to outlive any queue wait; short enough not to pile up


def _key(generation_id: int) -> str:
    return keys.cancel_requested(generation_id)


def request_cancel(generation_id: int) -> None:
    store.client().set(_key(generation_id), 1, ex=_TTL_S)


def is_cancel_requested(generation_id: int) -> bool:
    return bool(store.client().exists(_key(generation_id)))


def clear(generation_id: int) -> None:
    store.client().delete(_key(generation_id))


def cancelled_among(generation_ids: list[int]) -> set[int]:
    """Which of these generations a user asked to cancel: one round trip for a whole batch."""
    if not generation_ids:
        return set()
    with store.client().pipeline(transaction=False) as pipe:
        for generation_id in generation_ids:
            pipe.exists(_key(generation_id))
        return {g for g, exists in zip(generation_ids, pipe.execute()) if exists}
