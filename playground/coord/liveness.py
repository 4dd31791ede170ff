"""Is the worker behind a generation still alive? Heartbeats in Redis, and the one rule that
declares a generation lost.

A worker process keeps `playground:worker:<name>` alive while it lives, and
`playground:generation:<id>` while it runs that generation; the beats come from the process's
beacon child (`coord.beacon`), which ends with the worker process however it dies, so both keys
go with the process (its beacon deletes them) or a TTL after its host stopped reaching Redis, and
only then: a worker busy loading a model, converting a GGUF or building a huge prompt, on a
machine loaded by others, keeps them. The rule (`mark_lost_if_stale`) is shared
by the watchdog (web/following.py), the concurrency limit and the HTTP loads. It also ends a
queued generation whose task message Redis lost (it restarted without its data): no worker will
ever get it, and it would hold one of its owner's slots. `end_queued_for_outage` ends a queued
generation that its follower can no longer follow (Redis is gone).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone
from django.utils.translation import gettext

from playground import protocol
from playground.coord import beacon, cancel, keys, model_states, store, worker_routing
from playground.models import Generation

logger = logging.getLogger(__name__)

# A worker process's key: its beacon child beats it every HEARTBEAT_INTERVAL and ends with the
# process, so the key is gone this long after the process (or its host's link) is.
WORKER_TTL_S = 10
# A queue counts as served while a worker consuming it was seen this recently: long enough
# that a worker restarting after a crash is not refused, short enough to fail fast under
# `make run`, where no prefill/decode worker ever ran.
QUEUE_SEEN_TTL_S = 30
# A running generation's key is looked for only this long after its start (see `_why_lost`).
START_GRACE_S = 3.0


def generation_key(generation_id: int) -> str:
    return keys.generation_alive(generation_id)


class Heartbeat:
    """Keeps keys alive while something lives, from the beacon's child process (`coord.beacon`:
    no GIL pause of this process can let them lapse): `start()`, then `stop()` (the keys go
    now) or `hand_off(hold_s)` (they live `hold_s` more: the prefill worker's handoff)."""

    def __init__(self, keys_: str | list[str], ttl_s: float) -> None:
        self.keys = [keys_] if isinstance(keys_, str) else list(keys_)
        self.ttl_s = ttl_s
        self.is_beating = False

    def start(self) -> Heartbeat:
        """The keys exist when this returns."""
        self.beacon = beacon.get()
        for key in self.keys:
            self.beacon.beat(key, self.ttl_s)
        self.is_beating = True
        return self

    def stop(self) -> None:
        """Stops beating; the keys go now."""
        self._end(None)

    def hand_off(self, hold_s: float) -> None:
        """Stops beating; the keys live `hold_s` more."""
        self._end(hold_s)

    def _end(self, hold_s: float | None) -> None:
        if self.is_beating:
            self.is_beating = False
            for key in self.keys:
                self.beacon.drop(key, hold_s=hold_s)


@contextlib.contextmanager
def generation_heartbeat(generation_id: int) -> Iterator[Heartbeat]:
    """Beats for one generation; the key exists before the body runs and is gone after it
    (unless the body called `hand_off`: the prefill worker's handoff)."""
    beat = Heartbeat(generation_key(generation_id), settings.PLAYGROUND_HEARTBEAT_TTL_S).start()
    try:
        yield beat
    finally:
        beat.stop()


# This process's worker and queue beats: a worker that stops cleanly deletes their keys at once
# (`stop_worker_heartbeats`), so pages stop listing it then, not a TTL later.
_worker_beats: list[Heartbeat] = []


def start_worker_heartbeat(worker_name: str) -> Heartbeat:
    """Says this worker process is alive until it exits (its beacon child then ends) or `stop()`."""
    beat = Heartbeat(worker_routing.alive_key(worker_name), WORKER_TTL_S).start()
    _worker_beats.append(beat)
    return beat


def stop_worker_heartbeats() -> None:
    """This worker is going away: its alive and queue keys go now (a crash leaves them to expire)."""
    while _worker_beats:
        _worker_beats.pop().stop()


def start_queue_heartbeat(worker_name: str, queues: Iterable[str]) -> Heartbeat | None:
    """Says which queues this worker serves (see `queue_has_consumer`) until it exits."""
    queue_keys = [keys.queue_consumer(queue, worker_name) for queue in sorted(queues)]
    if not queue_keys:
        return None
    beat = Heartbeat(queue_keys, QUEUE_SEEN_TTL_S).start()
    _worker_beats.append(beat)
    return beat


def alive_workers() -> list[str]:
    """The names of the worker processes beating now (busy or idle), sorted."""
    prefix = worker_routing.alive_key("")
    names = store.client().scan_iter(match=worker_routing.alive_key("*"), count=100)
    return sorted(name.decode().removeprefix(prefix) for name in names)


def why_no_answer(waited_s: float, queue: str) -> str:
    """Why no worker answered a request within `waited_s`, as the workers say it: none runs, one
    is loading a model (and for how long), or they are busy. Redis unreachable: that."""
    try:
        workers, states = alive_workers(), model_states.current()
    except redis.RedisError:
        return str(store.OUTAGE_MESSAGE)
    loading = [state for state in states if state["state"] == "loading"]
    if not workers:
        return gettext("no generation worker is running (queue %(queue)r): start one (docs/running.md)") % {
            "queue": queue
        }
    if loading:
        return gettext(
            "the worker %(worker)s is loading %(model)s (%(seconds)s s so far); ask again once it is ready"
        ) % {
            "worker": loading[0]["worker"],
            "model": loading[0]["model_name"],
            "seconds": f"{loading[0]['elapsed_ms'] / 1000:.0f}",
        }
    return gettext("the workers (%(workers)s) are busy: none answered within %(seconds)s s; ask again in a moment") % {
        "workers": ", ".join(workers),
        "seconds": f"{waited_s:.0f}",
    }


def queue_has_consumer(queue: str) -> bool:
    """Whether some worker consuming `queue` was alive in the last QUEUE_SEEN_TTL_S seconds."""
    return next(store.client().scan_iter(match=keys.queue_consumer(queue, "*"), count=1000), None) is not None


# A queued generation's task is sent just after its row is written; one that Redis has no
# trace of after this long was lost with Redis' data.
TASK_SENT_WITHIN_S = 10
_NO_WORKER_MESSAGE = (
    "no worker picked up this generation; is a worker running (celery -A playground worker -Q gpu -P threads)?"
)
_WORKER_GONE_MESSAGE = (
    "the worker running this generation (%(worker)s) is gone: its process ended, or its host stopped reaching "
    "Redis; the partial answer was kept"
)
_TASK_LOST_MESSAGE = (
    "no worker will run this request: its task was lost (Redis restarted, or the server process that held it "
    "stopped); send it again"
)


def _why_lost(generation: Generation) -> tuple[str, str] | None:
    """(error code, message) when the generation can never end on its own, else None."""
    now = timezone.now()
    r = store.client()
    if generation.status == Generation.Status.RUNNING:
        # The beat starts (its key written) before `started_at` is stamped, so a missing key
        # means the worker's process is gone (its beacon deleted the key) or its host is (the key
        # expired), or it finished, which the conditional update in `mark_lost_if_stale` tells
        # apart. The grace covers a first write that failed and the beacon's next beat.
        if (
            generation.started_at is not None
            and generation.started_at < now - timedelta(seconds=START_GRACE_S)
            and not r.exists(generation_key(generation.pk))
        ):
            return "worker_lost", _WORKER_GONE_MESSAGE % {"worker": generation.worker or "?"}
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
        # Its client is answered now: a worker that still runs it (a host cut off from Redis for a
        # while, a task that comes late) stops at its next step instead of spending the batch on it.
        with contextlib.suppress(redis.RedisError):
            cancel.request_cancel(generation.pk)
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


REAP_INTERVAL_S = 30.0


def reap_once() -> int:
    """Applies the lost rule to every active row (a worker killed while nobody followed its
    generations left them `running`); how many it ended."""
    active = Generation.objects.filter(status__in=Generation.ACTIVE_STATUSES).defer(
        "steps", "prompt", "prompt_text", "inputs"
    )
    return sum(mark_lost_if_stale(generation) for generation in active)


def start_reaper(interval_s: float = REAP_INTERVAL_S) -> threading.Thread:
    """Every live worker runs `reap_once` every `interval_s`, so a dead worker's rows end within an
    interval (a TTL more for a host cut off) whether or not anyone reads them."""

    def reap_forever() -> None:
        while True:
            time.sleep(interval_s)
            try:
                num_ended = reap_once()
                if num_ended:
                    logger.info("ended %d generation(s) whose worker is gone", num_ended)
            except Exception:  # the database or Redis is away: the next round tries again
                logger.warning("reaping lost generations failed", exc_info=True)
            finally:
                close_old_connections()

    thread = threading.Thread(target=reap_forever, name="lost-reaper", daemon=True)
    thread.start()
    return thread


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
