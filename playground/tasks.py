"""Celery tasks (thin): the generation task on queue "gpu" and its enqueueing.

Must not import torch or `inference.engine` at import time (the web process imports this
module to enqueue); `runner` loads the engine lazily inside the worker.
"""
from __future__ import annotations

import socket
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup
from django.db import transaction

from playground import liveness, runner


@shared_task(bind=True, name="playground.tasks.run_generation")
def run_generation(self: Any, generation_id: int) -> None:
    runner.run_generation(generation_id, worker=self.request.hostname or socket.gethostname())


def enqueue(generation_id: int) -> None:
    """Queues the generation once the transaction that created its row has committed."""
    transaction.on_commit(lambda: run_generation.delay(generation_id))


@celeryd_after_setup.connect
def _announce_worker(sender: str, **kwargs: Any) -> None:
    """Lets the web process tell "no worker at all" from "the worker is busy" (see liveness)."""
    liveness.start_worker_heartbeat(sender)
