"""Celery tasks (thin: ids in, hand off to `playground.worker`): the generation task on queue
"gpu", the prefill/decode pair on queues "prefill" and "decode".

The web process imports this module to send tasks (see `dispatch`), so the worker package
(and with it the engine) is imported inside the task bodies only, in the worker process.
"""

from __future__ import annotations

import socket
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup

from playground.coord import liveness, worker_routing


def _worker_name(task: Any) -> str:
    return task.request.hostname or socket.gethostname()


@shared_task(bind=True, name="playground.tasks.run_generation")
def run_generation(self: Any, generation_id: int) -> None:
    from playground.worker import generation

    generation.run_generation(generation_id, worker=_worker_name(self))


@shared_task(bind=True, name="playground.tasks.run_prefill")
def run_prefill(self: Any, generation_id: int) -> None:
    from playground import dispatch
    from playground.worker import prefill_decode

    prefill_decode.run_prefill(generation_id, worker=_worker_name(self), enqueue_decode=dispatch.enqueue_decode)


@shared_task(bind=True, name="playground.tasks.run_decode")
def run_decode(self: Any, generation_id: int, blob_key: str) -> None:
    from playground.worker import prefill_decode

    prefill_decode.run_decode(generation_id, blob_key, worker=_worker_name(self))


@celeryd_after_setup.connect
def _announce_worker(sender: str, instance: Any = None, **kwargs: Any) -> None:
    """A generation worker also consumes its own queue (cache-aware routing sends a
    conversation's next turn there), and beats so the web process can tell "no worker at all"
    from "the worker is busy" (see liveness), and says which queues it serves, so a request
    no live worker can serve (e.g. prefill/decode with no such worker) is refused at once.
    Then it loads the default model (announced: `worker.model` events)."""
    if instance is not None and worker_routing.SHARED_QUEUE in instance.app.amqp.queues.consume_from:
        instance.app.amqp.queues.select_add(worker_routing.worker_queue(sender))
    liveness.start_worker_heartbeat(sender)
    from playground.worker import observer  # the live view and metrics name this worker as Celery does

    observer.set_worker_name(sender)
    if instance is not None:
        liveness.start_queue_heartbeat(sender, list(instance.app.amqp.queues.consume_from))
    # Last: the worker takes no work until this returns, so the first request finds its model
    # loaded; meanwhile every page shows "loading" and how long it has taken.
    from playground.worker import engines

    engines.preload_default_model()


@shared_task(bind=True, name="playground.tasks.run_test_load")
def run_test_load(self: Any, model_id: int) -> None:
    """The admin's "test load": loads the model on a worker and stores the report on its record."""
    from playground.worker import test_load

    test_load.run_test_load(model_id, worker=_worker_name(self))


@shared_task(name="playground.tasks.inspect_generation")
def inspect_generation(generation_id: int, request: dict[str, Any], reply_channel: str) -> None:
    """An inspection of a finished generation (docs/inside.md); the answer goes to `reply_channel`."""
    from playground.worker import inspect

    inspect.run_inspection(generation_id, request, reply_channel)
