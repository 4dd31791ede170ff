"""The live view of continuous batching: each engine step, as the worker saw it, published to
the channel-layer group `serving` for the serving page (at most `MAX_PER_S` per second).

Owns: the shape of a `serving.step` message (the engine's `BatchStep` with request ids
turned into generation ids) and the throttle. Must not know: sockets, the ORM.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from playground import protocol
from playground.coord.store import OUTAGE_ERRORS

if TYPE_CHECKING:
    from inference.engine_core import BatchStep

logger = logging.getLogger(__name__)

MAX_PER_S = 10.0
_state = {"last_sent": 0.0, "num_skipped": 0}


def publish(step: BatchStep, generation_of: dict[int, int], worker: str) -> None:
    """Sends the step unless one went out less than 1/MAX_PER_S ago (then counts it as skipped)."""
    now = time.monotonic()
    if now - _state["last_sent"] < 1.0 / MAX_PER_S:
        _state["num_skipped"] += 1
        return
    _state["last_sent"] = now
    message = serving_step(step, generation_of, worker, _state["num_skipped"])
    _state["num_skipped"] = 0
    try:
        async_to_sync(get_channel_layer().group_send)(protocol.SERVING_GROUP, message)
    except OUTAGE_ERRORS as exc:
        logger.warning("could not publish the serving view: Redis is unreachable (%s)", exc)
    except Exception:  # the view is a nicety: never let it stop the engine loop
        logger.warning("could not publish the serving view", exc_info=True)


def serving_step(step: BatchStep, generation_of: dict[int, int], worker: str, num_skipped: int) -> dict[str, Any]:
    data = step.to_dict()
    data["chunks"] = [{**c, "generation_id": generation_of.get(c["request_id"])} for c in data["chunks"]]
    data["preempted_ids"] = [generation_of.get(i) for i in data["preempted_ids"]]
    return protocol.serving_step(worker, protocol.json_safe(data), num_skipped)
