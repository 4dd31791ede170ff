"""This worker's model state, announced: "loading" (which model, since when), "ready" (and how
long the load took) or "error" (why the load failed).

Owns: the state of this process, its Redis record (`coord.model_states`, kept alive by the worker's
beacon so it expires with the worker) and the `worker.model` event to every page's
socket (channel-layer group `protocol.MODELS_GROUP`) on each change. `engines` calls `loading` /
`ready` / `failed` around every load it does, the preload at start included. Must not know:
sockets, the engine.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import redis

from playground import protocol
from playground.coord import model_states
from playground.worker import observer
from playground.worker.publisher import group_send

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_record: dict[str, Any] | None = None
_kept_as: str | None = None  # the worker name the record is kept under


def loading(model_id: int | None, model_name: str) -> None:
    _set(model_states.record("loading", model_id, model_name, time.time()))


def ready(model_id: int | None, model_name: str, load_ms: float) -> None:
    _set(model_states.record("ready", model_id, model_name, time.time(), load_ms=load_ms))


def failed(model_id: int | None, model_name: str, error: str) -> None:
    _set(model_states.record("error", model_id, model_name, time.time(), error=error[:500]))


def _set(record: dict[str, Any]) -> None:
    global _record, _kept_as
    worker = observer.worker_name()
    with _lock:
        _record = record
        renamed, _kept_as = (_kept_as if _kept_as not in (None, worker) else None), worker
    with contextlib.suppress(redis.RedisError):
        if renamed is not None:  # one record per process, under its current name
            model_states.forget(renamed)
        model_states.keep(worker, record)
    try:
        group_send(protocol.MODELS_GROUP, model_states.as_event(worker, record)).result()
    except Exception as exc:  # the pages learn the state on their next connect; loading goes on
        logger.warning("could not announce the model state %s: %s", record["state"], exc)
