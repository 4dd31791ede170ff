"""Is the worker behind a generation still alive? Heartbeats in Redis, and the one rule that
declares a generation lost.

A worker process refreshes `playground:worker:<name>` while it lives, and
`playground:generation:<id>` while it runs that generation; both keys expire on their own,
so a killed worker simply stops refreshing them. The rule (`mark_lost_if_stale`) is shared
by the consumer's watchdog, the concurrency limit and the HTTP loads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.utils import timezone

from playground import protocol
from playground.coord import keys, store, worker_routing
from playground.models import Generation

logger = logging.getLogger(__name__)

_WORKER_TTL_S = 5
# A queue counts as served while a worker consuming it was seen this recently: long enough
# that a worker restarting after a crash is not refused, short enough to fail fast under
# `make run`, where no prefill/decode worker ever ran.
QUEUE_SEEN_TTL_S = 30


def generation_key(generation_id: int) -> str:
    return keys.generation_alive(generation_id)


class Heartbeat(threading.Thread):
    """Refreshes one key every `interval_s` until stopped (then deletes it)."""

    def __init__(self, key: str, ttl_s: float, interval_s: float) -> None:
        super().__init__(name=f"heartbeat {key}", daemon=True)
        self.key, self.ttl_ms, self.interval_s = key, int(ttl_s * 1000), interval_s
        self.stopped = threading.Event()

    def beat(self) -> None:
        try:
            store.client().set(self.key, 1, px=self.ttl_ms)
        except redis.RedisError as exc:  # keep beating: Redis may come back
            logger.warning("heartbeat %s failed: %s", self.key, exc)

    def start(self) -> None:
        self.beat()  # the key exists as soon as start() returns
        super().start()

    def run(self) -> None:
        while not self.stopped.wait(self.interval_s):
            self.beat()

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        with contextlib.suppress(redis.RedisError):
            store.client().delete(self.key)


@contextlib.contextmanager
def generation_heartbeat(generation_id: int, beat_class: type[Heartbeat] = Heartbeat) -> Iterator[Heartbeat]:
    """Beats for one generation; the key exists before the body runs and is gone after it
    (unless `beat_class.stop` keeps it: the prefill worker's handoff)."""
    beat = beat_class(
        generation_key(generation_id), settings.PLAYGROUND_HEARTBEAT_TTL_S, settings.PLAYGROUND_HEARTBEAT_INTERVAL_S
    )
    beat.start()
    try:
        yield beat
    finally:
        beat.stop()


def start_worker_heartbeat(worker_name: str) -> Heartbeat:
    """Beats for this worker process until it exits (a daemon thread) or `stop()`."""
    beat = Heartbeat(worker_routing.alive_key(worker_name), _WORKER_TTL_S, 1.0)
    beat.start()
    return beat


class _QueueHeartbeat(Heartbeat):
    """Refreshes one key per queue a worker consumes (in one round trip)."""

    def __init__(self, queue_keys: list[str], ttl_s: float, interval_s: float) -> None:
        super().__init__(queue_keys[0], ttl_s, interval_s)
        self.queue_keys = queue_keys

    def beat(self) -> None:
        try:
            with store.client().pipeline() as pipe:
                for key in self.queue_keys:
                    pipe.set(key, 1, px=self.ttl_ms)
                pipe.execute()
        except redis.RedisError as exc:
            logger.warning("queue heartbeat %s failed: %s", self.queue_keys, exc)

    def stop(self) -> None:
        self.stopped.set()
        self.join()
        with contextlib.suppress(redis.RedisError):
            store.client().delete(*self.queue_keys)


def start_queue_heartbeat(worker_name: str, queues: Iterable[str]) -> Heartbeat | None:
    """Says which queues this worker serves (see `queue_has_consumer`) until it exits."""
    queue_keys = [keys.queue_consumer(queue, worker_name) for queue in sorted(queues)]
    if not queue_keys:
        return None
    beat = _QueueHeartbeat(queue_keys, QUEUE_SEEN_TTL_S, 1.0)
    beat.start()
    return beat


def alive_workers() -> list[str]:
    """The names of the worker processes beating now (busy or idle), sorted."""
    prefix = worker_routing.alive_key("")
    names = store.client().scan_iter(match=worker_routing.alive_key("*"), count=100)
    return sorted(name.decode().removeprefix(prefix) for name in names)


def queue_has_consumer(queue: str) -> bool:
    """Whether some worker consuming `queue` was alive in the last QUEUE_SEEN_TTL_S seconds."""
    return next(store.client().scan_iter(match=keys.queue_consumer(queue, "*"), count=1000), None) is not None


def _is_stale(generation: Generation) -> bool:
    now = timezone.now()
    if generation.status == Generation.Status.RUNNING:
        # The beat starts before `started_at` is stamped, so once the TTL has passed since
        # then a missing key means the worker stopped refreshing it (or finished, which
        # the conditional update in `mark_lost_if_stale` tells apart).
        ttl = timedelta(seconds=settings.PLAYGROUND_HEARTBEAT_TTL_S)
        return (
            generation.started_at is not None
            and generation.started_at < now - ttl
            and not store.client().exists(generation_key(generation.pk))
        )
    if generation.status == Generation.Status.QUEUED:
        timeout = timedelta(seconds=settings.PLAYGROUND_QUEUE_TIMEOUT_S)
        return (
            generation.created_at < now - timeout
            and next(store.client().scan_iter(match=worker_routing.alive_key("*"), count=100), None) is None
        )
    return False


def mark_lost_if_stale(generation: Generation) -> bool:
    """Marks an active generation whose worker is gone as `error`/`worker_lost`.

    True when this call marked it (so exactly one caller reports it). The update is
    conditional on the status read, so a worker that finished meanwhile wins.
    """
    try:
        if not _is_stale(generation):
            return False
    except redis.RedisError as exc:  # cannot tell: assume alive rather than kill it
        logger.warning("liveness check for generation %s failed: %s", generation.pk, exc)
        return False
    was_queued = generation.status == Generation.Status.QUEUED
    message = (
        "no worker picked up this generation; is a worker running (celery -A playground worker -Q gpu -P threads)?"
        if was_queued
        else "the worker running this generation stopped responding; the partial answer was kept"
    )
    num_updated = Generation.objects.filter(pk=generation.pk, status=generation.status).update(
        status=Generation.Status.ERROR,
        finish_reason="error",
        error_code="worker_lost",
        error_message=message,
        finished_at=timezone.now(),
    )
    if num_updated:
        logger.warning("generation %s lost: %s", generation.pk, message)
    return bool(num_updated)


def reconcile(generations: Iterable[Generation]) -> None:
    """Applies the lost rule to the active ones (call before reporting their status)."""
    for generation in generations:
        if generation.is_active:
            mark_lost_if_stale(generation)


def ended_event(generation_id: int) -> dict[str, Any] | None:
    """The terminal event of a generation that has ended (or was just declared lost by the rule
    above), else None: what a follower (the WebSocket consumer, the OpenAI stream) reports when
    the worker's own terminal event did not come."""
    generation = Generation.objects.filter(pk=generation_id).first()
    if generation is None:  # its conversation was deleted meanwhile
        return protocol.generation_error(generation_id, "not_found", f"generation {generation_id} was deleted")
    if generation.is_active:
        if not mark_lost_if_stale(generation):
            return None
        generation.refresh_from_db()
    return generation.terminal_event()
