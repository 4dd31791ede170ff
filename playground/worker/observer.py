"""What the engine loop reports besides each request's own events: the live batch view
(`serving_view`) and the Prometheus numbers (`metrics`), under this worker's name.

Owns: the worker's name as these reports show it (its Celery node name once the worker has
started, host:pid before that) and the glue the loop calls. Must not know: sockets, the ORM.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from playground.worker import serving_view
from playground.worker.metrics import WorkerMetrics

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.engine_core import BatchStep
    from inference.events import Event

_name = {"worker": f"{socket.gethostname()}:{os.getpid()}"}


def set_worker_name(name: str) -> None:
    """Called once the Celery worker knows its node name (tasks.`_announce_worker`)."""
    _name["worker"] = name


def worker_name() -> str:
    return _name["worker"]


class WorkerObserver:
    def __init__(self) -> None:
        self.worker = _name["worker"]
        self.metrics = WorkerMetrics(self.worker)

    def on_event(self, request_id: int, event: Event) -> None:
        self.metrics.observe(request_id, event)

    def after_step(
        self, engine: Engine, step: BatchStep | None, generation_of: dict[int, int], num_requests: int
    ) -> None:
        if step is not None:
            serving_view.publish(step, generation_of, self.worker)
        self.metrics.flush(engine, num_requests, force=num_requests == 0)
