"""Is the worker behind a generation still alive? Heartbeats in Redis, and the one rule that
declares a generation lost.

A worker process refreshes `playground:worker:<name>` while it lives, and
`playground:generation:<id>` while it runs that generation; both keys expire on their own,
so a killed worker simply stops refreshing them. The rule (`mark_lost_if_stale`) is shared
by the watchdog (web/following.py), the concurrency limit and the HTTP loads. It also ends a
queued generation whose task message Redis lost (it restarted without its data): no worker will
ever get it, and it would hold one of its owner's slots. `end_queued_for_outage` ends a queued
generation that its follower can no longer follow (Redis is gone).
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

    is_failing = False  # one warning per outage, not one per beat

    def beat(self) -> None:
        try:
            store.client().set(self.key, 1, px=self.ttl_ms)
        except redis.RedisError as exc:  # keep beating: Redis may come back
            self._failed(exc)
        else:
            self._answered()

    def _failed(self, exc: Exception) -> None:
        if not self.is_failing:
            logger.warning("heartbeat %s failed (retrying every %.1f s): %s", self.key, self.interval_s, exc)
        self.is_failing = True

    def _answered(self) -> None:
        if self.is_failing:
            logger.info("heartbeat %s: Redis answers again", self.key)
        self.is_failing = False

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


# This process's worker and queue beats: a worker that stops cleanly deletes their keys at once
# (`stop_worker_heartbeats`), so pages stop listing it then, not a TTL later.
_worker_beats: list[Heartbeat] = []


def start_worker_heartbeat(worker_name: str) -> Heartbeat:
    """Beats for this worker process until it exits (a daemon thread) or `stop()`."""
    beat = Heartbeat(worker_routing.alive_key(worker_name), _WORKER_TTL_S, 1.0)
    beat.start()
    _worker_beats.append(beat)
    return beat


def stop_worker_heartbeats() -> None:
    """This worker is going away: its alive and queue keys go now (a crash leaves them to expire)."""
    while _worker_beats:
        _worker_beats.pop().stop()


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
            self._failed(exc)
        else:
            self._answered()

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
    _worker_beats.append(beat)
    return beat


def alive_workers() -> list[str]:
    """The names of the worker processes beating now (busy or idle), sorted."""
    prefix = worker_routing.alive_key("")
    names = store.client().scan_iter(match=worker_routing.alive_key("*"), count=100)
    return sorted(name.decode().removeprefix(prefix) for name in names)


def queue_has_consumer(queue: str) -> bool:
    """Whether some worker consuming `queue` was alive in the last QUEUE_SEEN_TTL_S seconds."""
    return next(store.client().scan_iter(match=keys.queue_consumer(queue, "*"), count=1000), None) is not None


# A queued generation's task is sent just after its row is written; one that Redis has no
# trace of after this long was lost with Redis' data.
TASK_SENT_WITHIN_S = 10
_NO_WORKER_MESSAGE = (
    "no worker picked up this generation; is a worker running (celery -A playground worker -Q gpu -P threads)?"
)
_WORKER_GONE_MESSAGE = "the worker running this generation stopped responding; the partial answer was kept"
_TASK_LOST_MESSAGE = (
    "no worker will run this request: its task was lost (Redis restarted, or the server process that held it "
    "stopped); send it again"
)


def _why_lost(generation: Generation) -> tuple[str, str] | None:
    """(error code, message) when the generation can never end on its own, else None."""
    now = timezone.now()
    r = store.client()
    if generation.status == Generation.Status.RUNNING:
        # The beat starts before `started_at` is stamped, so once the TTL has passed since
        # then a missing key means the worker stopped refreshing it (or finished, which
        # the conditional update in `mark_lost_if_stale` tells apart).
        ttl = timedelta(seconds=settings.PLAYGROUND_HEARTBEAT_TTL_S)
        if (
            generation.started_at is not None
            and generation.started_at < now - ttl
            and not r.exists(generation_key(generation.pk))
        ):
            return "worker_lost", _WORKER_GONE_MESSAGE
    elif generation.status == Generation.Status.QUEUED:
        if generation.created_at < now - timedelta(seconds=settings.PLAYGROUND_QUEUE_TIMEOUT_S) and (
            next(r.scan_iter(match=worker_routing.alive_key("*"), count=100), None) is None
        ):
            return "worker_lost", _NO_WORKER_MESSAGE
        # An API generation waiting for its client's turn is held by its web process (marked, refreshed):
        # its task is not sent yet, and that is no loss (web/openai_api/turns.py).
        if (
            generation.created_at < now - timedelta(seconds=TASK_SENT_WITHIN_S)
            and worker_routing.is_task_lost(r, generation.pk)
            and not r.exists(keys.api_turn(generation.pk))
        ):
            return "service_unavailable", _TASK_LOST_MESSAGE
    return None


def mark_lost_if_stale(generation: Generation) -> bool:
    """Marks an active generation that can never end on its own as `error`: `worker_lost` when
    its worker is gone (or no worker lives to take a queued one), `service_unavailable` when
    Redis lost its queued task.

    True when this call marked it (so exactly one caller reports it). The update is
    conditional on the status read, so a worker that finished meanwhile wins.
    """
    try:
        why = _why_lost(generation)
    except redis.RedisError as exc:  # cannot tell: assume alive rather than kill it
        logger.debug("liveness check for generation %s failed: %s", generation.pk, exc)
        return False
    if why is None:
        return False
    code, message = why
    num_updated = Generation.objects.filter(pk=generation.pk, status=generation.status).update(
        status=Generation.Status.ERROR,
        finish_reason="error",
        error_code=code,
        error_message=message,
        finished_at=timezone.now(),
    )
    if num_updated:
        logger.warning("generation %s lost: %s", generation.pk, message)
    return bool(num_updated)


def end_queued_for_outage(generation_id: int) -> dict[str, Any] | None:
    """Ends a queued generation whose follower lost Redis (`service_unavailable`): its task may
    be gone, and nobody could be told when it runs. Returns its terminal event when it has
    ended (by this call or before), None while it is running (its worker ends it: it cannot
    publish either)."""
    Generation.objects.filter(pk=generation_id, status=Generation.Status.QUEUED).update(
        status=Generation.Status.ERROR,
        finish_reason="error",
        error_code="service_unavailable",
        error_message=store.OUTAGE_MESSAGE,
        finished_at=timezone.now(),
    )
    generation = _status_row(generation_id)
    if generation is None:
        return protocol.generation_error(generation_id, "not_found", f"generation {generation_id} was deleted")
    return None if generation.is_active else generation.terminal_event()


def _status_row(generation_id: int) -> Generation | None:
    """The row without the columns that grow with the prompt and the answer (read on demand):
    every follower checks its generation each second, and reading the steps made each check
    parse them all (a JSON list that grows with every token)."""
    return Generation.objects.filter(pk=generation_id).defer("steps", "prompt", "prompt_text", "inputs").first()


def reconcile(generations: Iterable[Generation]) -> None:
    """Applies the lost rule to the active ones (call before reporting their status)."""
    for generation in generations:
        if generation.is_active:
            mark_lost_if_stale(generation)


def ended_event(generation_id: int) -> dict[str, Any] | None:
    """The terminal event of a generation that has ended (or was just declared lost by the rule
    above), else None: what a follower (the WebSocket consumer, the OpenAI stream) reports when
    the worker's own terminal event did not come."""
    generation = _status_row(generation_id)
    if generation is None:  # its conversation was deleted meanwhile
        return protocol.generation_error(generation_id, "not_found", f"generation {generation_id} was deleted")
    if generation.is_active:
        if not mark_lost_if_stale(generation):
            return None
        generation.refresh_from_db()
    return generation.terminal_event()
