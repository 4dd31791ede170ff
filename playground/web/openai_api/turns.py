"""An API client's turn: its generations beyond its concurrency wait, in order, rather than fail.

A client (`auth.Client`) runs at most `max_concurrent` generations at once; the ones after wait
in the web process, as queued rows, until the client's earlier ones end (how many may wait:
`limits.check_api_backlog`, checked when the rows are made). A unit (the n choices of one
prompt, which run together on one worker) goes as a whole. The rule needs no shared counter: a
unit goes once the client's live (queued or running) generations made before it, plus the unit
itself, fit the concurrency. One request's rows are made in one transaction, in order, so turns
are first come, first served and never wait on each other in a circle (on PostgreSQL, two
requests of one client made in the same instant may interleave their ids; the rule then lets a
unit go early, never late).

Each row is marked in Redis (`keys.api_turn`): "waiting" while its request waits (refreshed at
every check, with a TTL), "sent" once it is queued for a worker. A queued row of the client with
no mark, older than that TTL, belongs to a web process that died: it is cancelled, so it blocks
no one. A running row whose worker died is declared lost by the usual rule (`liveness`).

Owns: the rule, the wait (a poll, woken early when a run of the same client in this process
ends) and the marks. Must not know: request parsing, answer shapes, the channel layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from channels.db import database_sync_to_async
from django.utils import timezone

from playground.coord import keys, liveness, store, worker_routing
from playground.models import Generation

logger = logging.getLogger(__name__)

WAITING_TTL_S = 30  # a waiting request refreshes its marks every POLL_S; a mark this old: its process died
SENT_TTL_S = worker_routing.CLAIM_TTL_S  # outlives any queue wait
POLL_S = 1.0  # other web processes' and dead workers' rows are seen by polling; this one's wake it
NUM_CHECKS_PER_RECONCILE = 5  # the lost rule on the running rows ahead, every this many checks

_wakeups: dict[str, set[asyncio.Event]] = {}  # owner -> the waits of this process


def notify(owner: str) -> None:
    """One of `owner`'s generations ended in this process: its waiting requests check at once."""
    for event in _wakeups.get(owner, ()):
        event.set()


async def wait_for_turn(owner: str, generation_ids: list[int], max_concurrent: int) -> None:
    """Returns once the unit `generation_ids` may go to the workers (and marks it sent)."""
    wakeup = asyncio.Event()
    _wakeups.setdefault(owner, set()).add(wakeup)
    try:
        num_checks = 0
        while True:
            wakeup.clear()
            should_reconcile = num_checks % NUM_CHECKS_PER_RECONCILE == 0
            if await database_sync_to_async(check_turn)(owner, generation_ids, max_concurrent, should_reconcile):
                return
            num_checks += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wakeup.wait(), POLL_S)
    finally:
        waits = _wakeups.get(owner, set())
        waits.discard(wakeup)
        if not waits:
            _wakeups.pop(owner, None)


def check_turn(owner: str, generation_ids: list[int], max_concurrent: int, should_reconcile: bool = True) -> bool:
    """True (and the unit marked sent) when the unit's turn has come; else it is marked waiting."""
    ahead = list(
        Generation.objects.filter(owner=owner, status__in=Generation.ACTIVE_STATUSES, pk__lt=min(generation_ids)).only(
            "pk", "status", "created_at", "started_at"
        )
    )
    num_ahead = len(ahead) - _cancel_orphans([g for g in ahead if g.status == Generation.Status.QUEUED])
    if should_reconcile:
        num_ahead -= sum(liveness.mark_lost_if_stale(g) for g in ahead if g.status == Generation.Status.RUNNING)
    # A unit larger than the concurrency (refused before it is made) would otherwise wait forever.
    is_turn = num_ahead + len(generation_ids) <= max_concurrent or num_ahead == 0
    mark, ttl_s = ("sent", SENT_TTL_S) if is_turn else ("waiting", WAITING_TTL_S)
    with store.client().pipeline(transaction=False) as pipe:
        for generation_id in generation_ids:
            pipe.set(keys.api_turn(generation_id), mark, ex=ttl_s)
        pipe.execute()
    return is_turn


def cancel_orphans(owner: str) -> int:
    """Cancels `owner`'s queued rows that no live web process holds (checked when the client's
    backlog looks full: they would otherwise refuse it for good); returns how many."""
    old = timezone.now() - timedelta(seconds=WAITING_TTL_S)
    queued = Generation.objects.filter(owner=owner, status=Generation.Status.QUEUED, created_at__lt=old)
    return _cancel_orphans(list(queued.only("pk", "created_at")))


def forget(generation_ids: list[int]) -> None:
    """Drops the marks of a request that ended (they would expire anyway)."""
    store.client().delete(*(keys.api_turn(generation_id) for generation_id in generation_ids))


def _cancel_orphans(queued: list[Generation]) -> int:
    """Cancels the queued rows that no live web process holds; returns how many."""
    if not queued:
        return 0
    with store.client().pipeline(transaction=False) as pipe:
        for generation in queued:
            pipe.exists(keys.api_turn(generation.pk))
        is_held = pipe.execute()
    old = timezone.now() - timedelta(seconds=WAITING_TTL_S)
    orphans = [g.pk for g, held in zip(queued, is_held, strict=True) if not held and g.created_at < old]
    if not orphans:
        return 0
    num_cancelled = Generation.objects.filter(pk__in=orphans, status=Generation.Status.QUEUED).update(
        status=Generation.Status.CANCELLED, finish_reason="cancelled", finished_at=timezone.now()
    )
    logger.warning(
        "cancelled %d queued API generations %s: the web process holding them is gone", num_cancelled, orphans
    )
    return num_cancelled
