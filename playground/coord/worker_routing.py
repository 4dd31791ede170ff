"""Cache-aware routing: send a conversation's next turn to the worker that holds its prefix.

Owns: the Redis keys that say which worker last served a conversation, which workers are
busy, that a generation's task was sent (and to which queue) and who claimed it; the routing
rule; the exactly-once claim; and the re-send of a request stranded on a dead worker's queue.
Must not know: Django, Celery, the engine. Every function takes a `redis.Redis` client, so
this module is unit-tested against a real Redis without either.

Queues: every worker consumes the shared queue `gpu` and its own `gpu.<worker name>`.
A request goes to the owner's own queue only while the owner is alive (its heartbeat key,
the one `playground.coord.liveness` refreshes) and idle; otherwise to `gpu`, where any worker
takes it and simply prefills the whole prompt. Routing is an optimisation, never a
correctness requirement: a worker that no longer has the prefix recomputes it.

Never lose, never duplicate: a task runs only after `claim_delivery()` wins an atomic `SET NX` on
the generation; a request left unclaimed on a private queue (its worker died, or became
busy the instant after it was routed) is re-sent to `gpu` once by `reroute_if_unclaimed`,
and whichever copy is claimed second is a no-op.
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from playground.coord import keys

SHARED_QUEUE = "gpu"
OWNER_TTL_S = 3600  # how long a conversation stays "at" a worker after its last turn
BUSY_TTL_S = 3600  # safety net only: a worker clears its busy flag when a generation ends
CLAIM_TTL_S = 24 * 3600  # outlives any queue wait, so a late duplicate always finds the claim
REROUTE_AFTER_S = 10.0  # an alive owner that has not claimed within this long is passed over


def worker_queue(worker_name: str) -> str:
    """The private queue of one worker (its Celery node name, e.g. `gpu@host`)."""
    return f"{SHARED_QUEUE}.{worker_name}"


def alive_key(worker_name: str) -> str:
    return keys.worker_alive(worker_name)


def _busy_key(worker_name: str) -> str:
    return keys.worker_busy(worker_name)


def _owner_key(conversation_id: int | str) -> str:
    return keys.prefix_owner(conversation_id)


def _claim_key(generation_id: int | str) -> str:
    return keys.generation_claimed(generation_id)


def _sent_key(generation_id: int | str) -> str:
    return keys.generation_sent(generation_id)


def _route_key(generation_id: int | str) -> str:
    return keys.generation_route(generation_id)


def _rerouted_key(generation_id: int | str) -> str:
    return keys.generation_rerouted(generation_id)


# ---- what workers publish ----------------------------------------------------------------


def set_busy(r: redis.Redis, worker_name: str, is_busy: bool) -> None:
    """Set while a worker runs a generation (cleared in a `finally`)."""
    if is_busy:
        r.set(_busy_key(worker_name), 1, ex=BUSY_TTL_S)
    else:
        r.delete(_busy_key(worker_name))


def record_owner(r: redis.Redis, conversation_id: int | str, worker_name: str, ttl_s: int = OWNER_TTL_S) -> None:
    """After a generation: this worker's prefix cache now holds the conversation."""
    r.set(_owner_key(conversation_id), worker_name, ex=ttl_s)


def owner_of(r: redis.Redis, conversation_id: int | str) -> str | None:
    name = r.get(_owner_key(conversation_id))
    return name.decode() if name is not None else None


# ---- the sender's side -----------------------------------------------------------------


def record_sent(r: redis.Redis, generation_id: int | str) -> None:
    """Call just before sending a generation's task (any queue)."""
    r.set(_sent_key(generation_id), 1, ex=CLAIM_TTL_S)


def is_task_lost(r: redis.Redis, generation_id: int | str) -> bool:
    """Neither sent nor claimed as far as Redis knows: the task message went with Redis' data
    (a restart without persistence), so no worker will ever run it. Ask only about a generation
    that has been queued for a while (its task is sent just after its row is written)."""
    with r.pipeline(transaction=False) as pipe:
        pipe.exists(_sent_key(generation_id))
        pipe.exists(_claim_key(generation_id))
        return not any(pipe.execute())


def choose_queue(r: redis.Redis, conversation_id: int | str | None) -> str:
    """The owner's private queue if it is alive and idle, else the shared queue."""
    owner = owner_of(r, conversation_id) if conversation_id is not None else None
    if owner is None:
        return SHARED_QUEUE
    is_alive, is_busy = r.exists(alive_key(owner)), r.exists(_busy_key(owner))
    return worker_queue(owner) if is_alive and not is_busy else SHARED_QUEUE


def route(r: redis.Redis, generation_id: int | str, conversation_id: int | str | None) -> str:
    """`choose_queue`, remembering the choice for `reroute_if_unclaimed`. Call just before sending.

    A Redis error gives the shared queue: routing is an optimisation, sending must not fail on it.
    """
    try:
        queue = choose_queue(r, conversation_id)
        if queue != SHARED_QUEUE:
            with r.pipeline() as pipe:
                pipe.hset(
                    _route_key(generation_id), mapping={"worker": queue.split(".", 1)[1], "sent_at": _server_time(r)}
                )
                pipe.expire(_route_key(generation_id), CLAIM_TTL_S)
                pipe.execute()
        return queue
    except redis.RedisError:
        return SHARED_QUEUE


def reroute_if_unclaimed(
    r: redis.Redis, generation_id: int | str, send: Callable[[str], None], timeout_s: float = REROUTE_AFTER_S
) -> bool:
    """Re-send a generation stranded on a private queue to the shared one; True if this call did.

    Stranded: routed to a private queue, not claimed, and its worker is dead or has not
    claimed it within `timeout_s`. At most one caller ever re-sends (an atomic flag); the
    watchdog (web/following.py) may call this as often as it likes. `send(queue)` enqueues the task.
    """
    if r.exists(_claim_key(generation_id)):
        return False
    routed = r.hgetall(_route_key(generation_id))
    if not routed:
        return False  # sent to the shared queue: any live worker takes it
    is_alive = r.exists(alive_key(routed[b"worker"].decode()))
    waited_s = _server_time(r) - float(routed[b"sent_at"])
    if is_alive and waited_s < timeout_s:
        return False
    if not r.set(_rerouted_key(generation_id), 1, nx=True, ex=CLAIM_TTL_S):
        return False
    send(SHARED_QUEUE)
    return True


# ---- the worker's side -----------------------------------------------------------------


def claim_delivery(r: redis.Redis, generation_id: int | str, worker_name: str) -> bool:
    """True for exactly one caller per generation: only that one may run it."""
    return bool(r.set(_claim_key(generation_id), worker_name, nx=True, ex=CLAIM_TTL_S))


def claimed_by(r: redis.Redis, generation_id: int | str) -> str | None:
    name = r.get(_claim_key(generation_id))
    return name.decode() if name is not None else None


def _server_time(r: redis.Redis) -> float:
    """Redis' clock, not this machine's: the sender and the watchdog may run on different hosts."""
    seconds, micros = r.time()
    return seconds + micros / 1e6
