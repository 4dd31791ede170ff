"""Celery tasks (thin: ids in, hand off to `playground.worker`): the generation task and the
several-choices task on queue "gpu", the prefill/decode pair on queues "prefill" and "decode".

The web process sends tasks by name (`dispatch.send`) and never imports this module; the worker
package (and with it the engine) is imported inside the task bodies, in the worker process.
"""

from __future__ import annotations

import socket
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup, task_postrun, worker_init, worker_shutting_down
from django.conf import settings
from django.db import reset_queries

from playground import task_names
from playground.coord import liveness, worker_routing


def _worker_name(task: Any) -> str:
    return task.request.hostname or socket.gethostname()


@shared_task(bind=True, name=task_names.RUN_GENERATION)
def run_generation(self: Any, generation_id: int) -> None:
    from playground.worker import generation

    generation.run_generation(generation_id, worker=_worker_name(self))


@shared_task(bind=True, name=task_names.RUN_CHOICES)
def run_choices(self: Any, generation_ids: list[int]) -> None:
    """The n choices of one prompt, as one unit on one worker (`worker.choices`)."""
    from playground.worker import choices

    choices.run_choices(generation_ids, worker=_worker_name(self))


@shared_task(bind=True, name=task_names.RUN_PREFILL)
def run_prefill(self: Any, generation_id: int) -> None:
    from playground import dispatch
    from playground.worker import prefill_decode

    prefill_decode.run_prefill(generation_id, worker=_worker_name(self), enqueue_decode=dispatch.enqueue_decode)


@shared_task(bind=True, name=task_names.RUN_DECODE)
def run_decode(self: Any, generation_id: int, blob_key: str) -> None:
    from playground.worker import prefill_decode

    prefill_decode.run_decode(generation_id, blob_key, worker=_worker_name(self))


@worker_init.connect
def _no_query_log(**kwargs: Any) -> None:
    """A worker logs no query's SQL, DEBUG or not: under `make run`'s DEBUG Django formatted each
    query with its parameters for its log, and a save of a generation's steps inlines up to a
    megabyte of them (16 streams: a tenth of the task threads' time). Nothing reads that log here."""
    settings.DEBUG = False


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
    liveness.start_reaper()  # a dead worker's rows end even when nobody reads them
    from playground.worker import observer  # the live view and metrics name this worker as Celery does

    observer.set_worker_name(sender)
    if instance is not None:
        liveness.start_queue_heartbeat(sender, list(instance.app.amqp.queues.consume_from))
    # Last: the worker takes no work until this returns, so the first request finds its model
    # loaded; meanwhile every page shows "loading" and how long it has taken.
    from playground.worker import engines

    engines.preload_default_model()


@worker_shutting_down.connect
def _stop_generations(**kwargs: Any) -> None:
    """SIGTERM or Ctrl-C: the running generations end now, each with its terminal event and its
    row saved, so the shutdown neither waits for them nor leaves rows `running`; then the worker
    stops saying it is alive (the serving page and the queue checks see it gone at once)."""
    from playground.worker import generation

    generation.stop_for_shutdown()
    liveness.stop_worker_heartbeats()


@task_postrun.connect
def _forget_logged_queries(**kwargs: Any) -> None:
    """Under DEBUG (`make run`'s default) Django keeps every query's SQL on its connection until
    a web request starts; a worker serves no web request, so each of its pool threads kept the
    last 9,000 queries, the generations' saved steps inlined in them: RSS grew with every
    generation (issue 21, docs/reliability.md "Worker memory"). Forgotten after each task, on
    the thread that ran it (the connections are per thread)."""
    reset_queries()


@shared_task(bind=True, name=task_names.RUN_TEST_LOAD)
def run_test_load(self: Any, model_id: int) -> None:
    """The admin's "test load": loads the model on a worker and stores the report on its record."""
    from playground.worker import load_report

    load_report.run_test_load(model_id, worker=_worker_name(self))


@shared_task(name=task_names.INSPECT_GENERATION)
def inspect_generation(generation_id: int, request: dict[str, Any], reply_channel: str) -> None:
    """An inspection of a finished generation (docs/inside.md); the answer goes to `reply_channel`."""
    from playground.worker import inspections

    inspections.run_inspection(generation_id, request, reply_channel)
