"""The live view of continuous batching: each engine step, as the worker saw it, published to
the channel-layer group `serving` for the serving page (at most `MAX_PER_S` per second).

Owns: the shape of a `serving.step` message (the engine's `BatchStep` with request ids
turned into generation ids) and the throttle. Must not know: sockets, the ORM.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import TYPE_CHECKING, Any

from playground import protocol
from playground.coord.store import OUTAGE_ERRORS
from playground.worker.publisher import group_send

if TYPE_CHECKING:
    from inference.engine_core import BatchStep

logger = logging.getLogger(__name__)

MAX_PER_S = 10.0
_state: dict[str, Any] = {"last_sent": 0.0, "num_skipped": 0, "in_flight": None}


def publish(step: BatchStep, generation_of: dict[int, int], worker: str) -> None:
    """Hands the step to the sending loop unless one went out less than 1/MAX_PER_S ago or the
    last one is still on its way (then counts it as skipped). Called on the engine thread: it
    never waits for Redis."""
    now = time.monotonic()
    in_flight = _state["in_flight"]
    if now - _state["last_sent"] < 1.0 / MAX_PER_S or (in_flight is not None and not in_flight.done()):
        _state["num_skipped"] += 1
        return
    _state["last_sent"] = now
    message = serving_step(step, generation_of, worker, _state["num_skipped"])
    _state["num_skipped"] = 0
    _state["in_flight"] = group_send(protocol.SERVING_GROUP, message)
    _state["in_flight"].add_done_callback(_log_failure)


def _log_failure(sent: concurrent.futures.Future) -> None:
    exc = sent.exception()
    if isinstance(exc, OUTAGE_ERRORS):
        logger.warning("could not publish the serving view: Redis is unreachable (%s)", exc)
    elif exc is not None:  # the view is a nicety: a failure is logged, never raised
        logger.warning("could not publish the serving view", exc_info=exc)


def serving_step(step: BatchStep, generation_of: dict[int, int], worker: str, num_skipped: int) -> dict[str, Any]:
    data = step.to_dict()
    data["chunks"] = [{**c, "generation_id": generation_of.get(c["request_id"])} for c in data["chunks"]]
    data["preempted_ids"] = [generation_of.get(i) for i in data["preempted_ids"]]
    return protocol.serving_step(worker, protocol.json_safe(data), num_skipped)
