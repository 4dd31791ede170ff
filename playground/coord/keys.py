"""Every Redis key name the playground uses, in one place (the channel layer and the Celery
broker name their own).

All keys start with `playground:`. Each is written by one side and read by the other; the
comment says who. Keys with a TTL expire on their own, so a killed process leaks nothing.
"""

from __future__ import annotations

PREFIX = "playground:"
WORKER_ALIVE_PREFIX = PREFIX + "worker:"  # liveness counts every key under it as a live worker
KV_BLOB_PREFIX = PREFIX + "kv:"


def worker_alive(worker_name: str) -> str:
    """Refreshed by a worker process while it lives (liveness, routing read it)."""
    return WORKER_ALIVE_PREFIX + worker_name


def worker_busy(worker_name: str) -> str:
    """Set by a worker while it runs a generation (routing reads it). Not under
    `WORKER_ALIVE_PREFIX`: liveness counts keys there as live workers."""
    return f"{PREFIX}worker-busy:{worker_name}"


def worker_model(worker_name: str) -> str:
    """A worker's model state (JSON: loading / ready / error, which model, since when), refreshed
    while the worker lives; every page's socket reads it on connect. Not under `WORKER_ALIVE_PREFIX`."""
    return f"{PREFIX}worker-model:{worker_name}"


def queue_consumer(queue: str, worker_name: str) -> str:
    """Refreshed by a worker for each queue it consumes, with a longer TTL than `worker_alive`
    ("seen recently"); dispatch reads it to refuse a request no live worker can serve. Not
    under `WORKER_ALIVE_PREFIX`."""
    return f"{PREFIX}queue-consumer:{queue}:{worker_name}"


def generation_alive(generation_id: int | str) -> str:
    """Refreshed by the worker running a generation (the watchdog reads it: web/following.py)."""
    return f"{PREFIX}generation:{generation_id}"


def generation_claimed(generation_id: int | str) -> str:
    """The worker that won the exactly-once delivery of a generation's task (SET NX)."""
    return f"{PREFIX}generation:{generation_id}:claimed"


def generation_sent(generation_id: int | str) -> str:
    """Set by whoever sends a generation's task (dispatch); a queued generation without it was
    lost with Redis' data (liveness reads it)."""
    return f"{PREFIX}generation:{generation_id}:sent"


def generation_route(generation_id: int | str) -> str:
    """Which private queue a generation was sent to, and when (for the re-send of a stranded one)."""
    return f"{PREFIX}generation:{generation_id}:route"


def generation_rerouted(generation_id: int | str) -> str:
    """Set once a stranded generation was re-sent to the shared queue (at most one re-send)."""
    return f"{PREFIX}generation:{generation_id}:rerouted"


def api_turn(generation_id: int | str) -> str:
    """Set by the web process that holds an API generation: "waiting" while it waits for its
    client's turn (refreshed, short TTL), then "sent" once queued for a worker. A queued API
    generation without it belongs to a web process that died (`web/openai_api/turns.py`)."""
    return f"{PREFIX}generation:{generation_id}:api-turn"


def recent_steps(generation_id: int | str) -> str:
    """The steps a running generation published since its row was last saved (a sorted set by
    step index): written by its worker, read by the web side when a page re-attaches."""
    return f"{PREFIX}generation:{generation_id}:recent-steps"


def cancel_requested(generation_id: int | str) -> str:
    """Set by the web side when a user stops a generation; the worker reads it every step."""
    return f"{PREFIX}cancel:{generation_id}"


def prefix_owner(conversation_id: int | str) -> str:
    """The worker whose prefix cache holds a conversation's last turn (routing)."""
    return f"{PREFIX}prefix-owner:{conversation_id}"


def kv_blob(name: str) -> str:
    """A KV blob's manifest; its chunks are `kv_blob(name) + ":<n>"` (prefill -> decode handoff)."""
    return KV_BLOB_PREFIX + name


def worker_metrics(worker_name: str) -> str:
    """A worker's metrics snapshot (JSON), refreshed about once a second; /metrics reads them all."""
    return f"{PREFIX}metrics:{worker_name}"


WORKER_METRICS_PATTERN = f"{PREFIX}metrics:*"
