"""Celery tasks (thin): the generation task on queue "gpu", the prefill/decode pair on queues
"prefill" and "decode" (see `pd`), and their enqueueing.

Must not import torch or `inference.engine` at import time (the web process imports this
module to enqueue); `runner` loads the engine lazily inside the worker.
"""
from __future__ import annotations

import socket
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup
from django.db import transaction

from playground import liveness, pd, runner, store, worker_routing


def _worker_name(task: Any) -> str:
    return task.request.hostname or socket.gethostname()


@shared_task(bind=True, name="playground.tasks.run_generation")
def run_generation(self: Any, generation_id: int) -> None:
    runner.run_generation(generation_id, worker=_worker_name(self))


@shared_task(bind=True, name="playground.tasks.run_prefill")
def run_prefill(self: Any, generation_id: int) -> None:
    pd.run_prefill(generation_id, worker=_worker_name(self), enqueue_decode=enqueue_decode)


@shared_task(bind=True, name="playground.tasks.run_decode")
def run_decode(self: Any, generation_id: int, blob_key: str) -> None:
    pd.run_decode(generation_id, blob_key, worker=_worker_name(self))


def enqueue(generation_id: int, pd_requested: bool | None = None, conversation_id: int | None = None) -> None:
    """Queues the generation once the transaction that created its row has committed: on
    "prefill" when prefill and decode run disaggregated (`pd.is_disaggregated`); otherwise on
    the private queue of the worker that holds the conversation's prefix in its KV cache when
    that worker is alive and idle (`worker_routing`), else on the shared "gpu" queue."""
    if pd.is_disaggregated(pd_requested):
        transaction.on_commit(lambda: run_prefill.delay(generation_id))
        return

    transaction.on_commit(lambda: _send(generation_id, worker_routing.route(store.client(), generation_id,
                                                                            conversation_id)))


def reroute_if_stranded(generation_id: int) -> bool:
    """Re-sends a generation whose chosen worker died (or stalled) before claiming it to "gpu";
    the worker-side claim makes the late original a no-op. Called by the consumer's watchdog."""
    return worker_routing.reroute_if_unclaimed(store.client(), generation_id,
                                               lambda queue: _send(generation_id, queue))


def _send(generation_id: int, queue: str) -> None:
    run_generation.apply_async((generation_id,), queue=queue)


def enqueue_decode(generation_id: int, blob_key: str) -> None:
    """Called by the prefill worker once the KV blob is stored: no task waits on another."""
    run_decode.delay(generation_id, blob_key)


@celeryd_after_setup.connect
def _announce_worker(sender: str, instance: Any = None, **kwargs: Any) -> None:
    """A generation worker also consumes its own queue (cache-aware routing sends a
    conversation's next turn there), and beats so the web process can tell "no worker at all"
    from "the worker is busy" (see liveness)."""
    if instance is not None and worker_routing.SHARED_QUEUE in instance.app.amqp.queues.consume_from:
        instance.app.amqp.queues.select_add(worker_routing.worker_queue(sender))
    liveness.start_worker_heartbeat(sender)
