"""Where a generation goes: colocated or prefill/decode disaggregated, which queue, and the
re-send of one stranded on a dead worker's queue.

Owns: the PD mode (`PLAYGROUND_PD_MODE`, overridable per request by the command field
`"pd"`), cache-aware routing wired to the Celery tasks, the decode task's enqueue after a
handoff. Runs in both processes (the consumer enqueues, the prefill worker enqueues the
decode), so it imports neither torch nor the worker package nor the task bodies: tasks are
sent by name (`send`).
"""

from __future__ import annotations

from typing import Any

import redis
from django.conf import settings
from django.utils.translation import gettext

from playground import task_names
from playground.celery import app
from playground.coord import liveness, store, worker_routing
from playground.protocol import CommandError, get_field

PD_QUEUES = ("prefill", "decode")


def pd_requested(content: dict[str, Any]) -> bool | None:
    """The command's optional `"pd"`: true/false overrides PLAYGROUND_PD_MODE for this request."""
    return get_field(content, "pd", bool)


def is_disaggregated(pd_requested: bool | None) -> bool:
    return pd_requested if pd_requested is not None else settings.PLAYGROUND_PD_MODE == "disaggregated"


def check_servable(pd_requested: bool | None) -> None:
    """Refuses (`no_worker_for_mode`) a disaggregated request when no prefill or no decode
    worker was seen recently: queued, it would wait forever and hold the client's slots.
    Call before anything is written. If Redis cannot tell, the request goes on."""
    if not is_disaggregated(pd_requested):
        return
    try:
        missing = [queue for queue in PD_QUEUES if not liveness.queue_has_consumer(queue)]
    except redis.RedisError:
        return
    if missing:
        roles = gettext(" and ").join(gettext("a %(queue)s worker") % {"queue": queue} for queue in missing)
        raise CommandError(
            "no_worker_for_mode",
            gettext(
                "prefill/decode disaggregation needs %(roles)s, and none has been running in the last %(seconds)s s: "
                'run it colocated (untick PD, or send "pd": false) or start the missing worker '
                "(celery -A playground worker -Q %(queue)s; see docs/running.md)"
            )
            % {"roles": roles, "seconds": liveness.QUEUE_SEEN_TTL_S, "queue": missing[0]},
        )


def enqueue(generation_id: int, pd_requested: bool | None = None, conversation_id: int | None = None) -> None:
    """Sends the task of a generation whose row is committed: on "prefill" when prefill and
    decode run disaggregated (`is_disaggregated`); otherwise on the private queue of the worker
    that holds the conversation's prefix in its KV cache when that worker is alive and idle
    (`worker_routing`), else on the shared "gpu" queue. Reads Redis only, never the database:
    the web process runs it off its one database thread, so the requests of a class that press
    send together are not each queued behind the others' row creations."""
    if is_disaggregated(pd_requested):
        _send_prefill(generation_id)
    else:
        _send(generation_id, worker_routing.route(store.client(), generation_id, conversation_id))


def enqueue_choices(generation_ids: list[int], pd_requested: bool | None = None) -> None:
    """Sends the n choices of one prompt (committed rows) as one task, so one worker runs them
    together and they share the prompt (`worker.choices`), on the shared queue: a new prompt has
    no prefix owner. Disaggregated, each choice goes through prefill and decode on its own."""
    if len(generation_ids) == 1 or is_disaggregated(pd_requested):
        for generation_id in generation_ids:
            enqueue(generation_id, pd_requested)
    else:
        send(task_names.RUN_CHOICES, list(generation_ids), queue=worker_routing.SHARED_QUEUE)


def reroute_if_stranded(generation_id: int) -> bool:
    """Re-sends a generation whose chosen worker died (or stalled) before claiming it to "gpu";
    the worker-side claim makes the late original a no-op. Called by the watchdog (web/following.py)."""
    return worker_routing.reroute_if_unclaimed(store.client(), generation_id, lambda queue: _send(generation_id, queue))


def enqueue_decode(generation_id: int, blob_key: str) -> None:
    """Called by the prefill worker once the KV blob is stored: no task waits on another."""
    send(task_names.RUN_DECODE, generation_id, blob_key)


def _send(generation_id: int, queue: str) -> None:
    worker_routing.record_sent(store.client(), generation_id)
    send(task_names.RUN_GENERATION, generation_id, queue=queue)


def _send_prefill(generation_id: int) -> None:
    worker_routing.record_sent(store.client(), generation_id)
    send(task_names.RUN_PREFILL, generation_id)


def send(task_name: str, *args: Any, queue: str | None = None) -> None:
    """Sends a task by its name (`playground.task_names`), on `queue` or the one its route names."""
    app.send_task(task_name, args=args, queue=queue)
