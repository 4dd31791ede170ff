"""`POST /api/generations/<id>/inspect/`: a question about a finished generation, answered
by a worker (docs/inside.md).

Owns: the owner check, the request's validation (`playground.inspection`), sending the
inspection task with a fresh reply channel and waiting for the one answer on it (with a
timeout, so a page never hangs on a missing worker). The web process runs no model: the
worker recomputes what it is asked. Must not import torch or the worker package.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.translation import gettext

from playground import dispatch, inspection, task_names
from playground.coord import liveness, worker_routing
from playground.models import Generation
from playground.protocol import CommandError
from playground.web import request_body
from playground.web.endpoints import error_response, owned_by
from playground.web.submit import owned_generation

logger = logging.getLogger(__name__)

_STATUS_BY_CODE = {
    "not_found": 404,
    "session_changed": 409,
    "inspection_timeout": 504,
    "model_unavailable": 503,
    "service_unavailable": 503,
    "internal_error": 500,
    **request_body.STATUS_BY_CODE,
}


async def inspect_generation(request: HttpRequest, generation_id: int) -> HttpResponse:
    if request.method != "POST":
        return error_response("method_not_allowed", f"{request.method} is not allowed here; use POST", 405)
    try:
        return JsonResponse(await _inspect(request, generation_id))
    except CommandError as exc:
        return error_response(exc.code, exc.message, _STATUS_BY_CODE.get(exc.code, 400))


async def _inspect(request: HttpRequest, generation_id: int) -> dict[str, Any]:
    content = request_body.json_body(request)
    owner = await sync_to_async(owned_by)(request)
    row = await sync_to_async(_finished)(owner, generation_id)
    # A run that gave no seed drew one, reported in its stats: what-ifs replay with it.
    seed = row.params.get("seed")
    params = {**row.params, "seed": seed if seed is not None else (row.stats or {}).get("seed")}
    checked = inspection.parse(content, params)
    if checked["other_generation_id"] is not None:  # the "ab" view's side B: this owner's too
        await sync_to_async(_finished)(owner, checked["other_generation_id"])
    return await ask_worker(generation_id, checked)


def _finished(owner: str, generation_id: int) -> Generation:
    row = owned_generation(owner, generation_id)
    if row.is_active:
        raise CommandError(
            "invalid_params",
            gettext("generation %(id)s is still %(status)s: inspect it once it ends")
            % {"id": generation_id, "status": row.status},
        )
    return row


async def ask_worker(generation_id: int, checked: dict[str, Any]) -> dict[str, Any]:
    """Sends a checked inspection of a finished generation to a worker and waits for its answer
    (a `CommandError` with the worker's code, or `inspection_timeout`)."""
    layer = get_channel_layer()
    reply_channel = await layer.new_channel()
    await sync_to_async(send_task)(generation_id, checked, reply_channel)
    try:
        answer = await asyncio.wait_for(layer.receive(reply_channel), timeout=inspection.WAIT_S)
    except TimeoutError:
        why = await sync_to_async(liveness.why_no_answer)(inspection.WAIT_S, worker_routing.SHARED_QUEUE)
        raise CommandError("inspection_timeout", why) from None
    if not answer.get("ok"):
        raise CommandError(answer.get("code", "internal_error"), answer.get("message", "the inspection failed"))
    return answer["result"]


def send_task(generation_id: int, checked: dict[str, Any], reply_channel: str) -> None:
    """Queues the inspection on the shared generation queue (any worker can load the model)."""
    dispatch.send(
        task_names.INSPECT_GENERATION, generation_id, checked, reply_channel, queue=worker_routing.SHARED_QUEUE
    )
