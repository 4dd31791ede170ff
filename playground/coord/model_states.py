"""Every worker's model state in Redis: which model it holds or is loading, and since when.

Owns: the record (`state`, `model_id`, `model_name`, `started_at` and `load_ms`, `error`) under
`keys.worker_model(worker)`, written by the worker and kept alive by its beacon (a killed worker's record
expires on its own), and `current()`: every live worker's state as the
`worker.model` events the pages get (elapsed time measured here, on one clock). Must not know:
the engine, sockets.
"""

from __future__ import annotations

import json
import time
from typing import Any

from playground import protocol
from playground.coord import beacon, keys, store

TTL_S = 10  # as a worker's liveness key: beaten by its beacon while the worker process lives


def keep(worker: str, record: dict[str, Any]) -> None:
    """Keeps the worker's record alive (from its beacon child) until it changes or the worker ends."""
    beacon.get().beat(keys.worker_model(worker), TTL_S, json.dumps(record))


def forget(worker: str) -> None:
    """Stops keeping `worker`'s record (this process took another name): it goes now."""
    beacon.get().drop(keys.worker_model(worker))


def record(state: str, model_id: int | None, model_name: str, started_at: float, **extra: Any) -> dict[str, Any]:
    """`started_at`: wall-clock seconds (time.time()) when the state began."""
    return {"state": state, "model_id": model_id, "model_name": model_name, "started_at": started_at, **extra}


def as_event(worker: str, saved: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    elapsed_ms = max(0.0, ((now or time.time()) - saved["started_at"]) * 1000)
    return protocol.worker_model(
        worker,
        saved["state"],
        saved.get("model_id"),
        saved.get("model_name", ""),
        elapsed_ms,
        saved.get("load_ms"),
        saved.get("error", ""),
    )


def current() -> list[dict[str, Any]]:
    """The `worker.model` event of every live worker (those whose record has not expired)."""
    r = store.client()
    prefix = keys.worker_model("")
    events = []
    for name in sorted(r.scan_iter(match=keys.worker_model("*"), count=100)):
        raw = r.get(name)
        if raw is None:  # expired between the scan and the read
            continue
        try:
            saved = json.loads(raw)
        except ValueError:
            continue
        events.append(as_event(name.decode().removeprefix(prefix), saved))
    return events
