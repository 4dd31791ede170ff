"""Cancel requests (a user's stop, not a stop string): a flag in Redis that the consumer sets
and the worker's `should_cancel` reads.

A flag rather than a Celery revoke: the solo pool runs the generation in the process that
would have to receive the control message, and the engine checks the flag each step.
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
