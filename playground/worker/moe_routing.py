"""MoE routing of a finished generation, run by the Celery worker (docs/deepseek.md).

Owns: reading the generation's token ids from its row (the prompt as the model saw it, then the
generated tokens), one batch-1 inspection pass with hooks on the routers through the engine loop
(`inference.introspect.moe.routing_trace`), and sending the one answer to the web process's
reply channel as {"type": "inspection.result", "ok", "result" | "code", "message"}.
Must not know: sockets, HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from playground import protocol
from playground.models import Generation, LanguageModel
from playground.protocol import CommandError
from playground.worker.engines import get_engine, loop_for

if TYPE_CHECKING:
    from inference.engine import Engine

logger = logging.getLogger(__name__)


def token_ids_of(row: Generation) -> tuple[list[int], int]:
    """(every token id the model read or wrote, the position of the first generated one)."""
    if row.is_active:
        raise CommandError("invalid_params", f"generation {row.pk} is still {row.status}: trace it once it ends")
    if any(step.get("type") == "beam_step" for step in row.steps):
        raise CommandError("invalid_params", "beam search keeps several paths: its routing cannot be traced here")
    prompt_ids = [int(token["id"]) for token in (row.prompt or {}).get("tokens", [])]
    generated = [int(step["token_id"]) for step in row.steps]
    if not generated:
        raise CommandError("invalid_params", f"generation {row.pk} has no generated token to trace")
    return prompt_ids + generated, len(prompt_ids)


def moe_routing(generation_id: int, load_engine: Callable[[LanguageModel], Engine] = get_engine) -> dict[str, Any]:
    from inference.introspect.moe import routing_trace

    row = Generation.objects.select_related("model").filter(pk=generation_id).first()
    if row is None:
        raise CommandError("not_found", f"generation {generation_id} does not exist")
    if row.model is None:
        raise CommandError("model_unavailable", "the generation's model was deleted")
    ids, first = token_ids_of(row)
    engine = load_engine(row.model)
    try:
        trace = loop_for(engine).call(lambda: routing_trace(engine.runner.model, ids, first_position=first))
    except ValueError as exc:  # a dense model: nothing to route
        raise CommandError("invalid_params", f"{row.model.name}: {exc}") from exc
    return {"generation_id": generation_id, "model": row.model.name, **trace}


def run_moe_routing(
    generation_id: int, reply_channel: str, load_engine: Callable[[LanguageModel], Engine] = get_engine
) -> None:
    try:
        answer = {"ok": True, "result": protocol.json_safe(moe_routing(generation_id, load_engine))}
    except CommandError as exc:
        answer = {"ok": False, "code": exc.code, "message": exc.message}
    except Exception as exc:
        logger.exception("MoE routing of generation %s failed", generation_id)
        answer = {"ok": False, "code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
    async_to_sync(get_channel_layer().send)(reply_channel, {"type": "inspection.result", **answer})
