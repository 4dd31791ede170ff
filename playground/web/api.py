"""The HTTP JSON endpoints of docs/protocol.md: models, presets, conversations, generations.

Owns: request parsing and the JSON shapes of the records; every record is looked up through
the request's owner (`owners.request_owner`: the browser session's, never a value the client
sends). Errors answer `{"error": {"code", "message"}}` with a 4xx status (`endpoints`).
Mutations go through Django's CSRF middleware (header `X-CSRFToken`).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.translation import gettext

from inference.text.reasoning import segments_for_browser
from playground import limits
from playground.coord import cancel, liveness
from playground.model_choice import default_model, summary, unavailable_reason
from playground.models import Conversation, Generation, LanguageModel, Message, SamplingPreset
from playground.protocol import CommandError, get_field, prompt_record, without_server_paths
from playground.web import owners, request_body
from playground.web.architecture import accepts_images
from playground.web.endpoints import endpoint, owned_by
from playground.web.model_template import model_default_system_prompt
from playground.web.submit import owned_conversation, owned_generation, resolve_model, resolve_preset


def _body(request: HttpRequest) -> dict[str, Any]:
    body = request_body.json_body(request)
    if not isinstance(body, dict):
        raise CommandError("bad_json", "the body must be a JSON object")
    return body


# Shapes ----------------------------------------------------------------------------------


def message_json(message: Message) -> dict[str, Any]:
    generation = message.generation
    segments = (
        segments_for_browser(
            message.content,
            starts_in_reasoning=generation is not None and generation.opens_reasoning,
        )
        if message.role == Message.Role.ASSISTANT
        else []
    )
    return {
        "id": message.pk,
        "role": message.role,
        "content": message.content,
        "images": message.images,  # with their data: the page shows them as thumbnails
        "segments": segments,
        "created_at": message.created_at.isoformat(),
        "generation_id": message.generation_id,
        "stats": generation.stats if generation else None,
        "status": generation.status if generation else None,
        "error": (
            {"code": generation.error_code, "message": without_server_paths(generation.error_message)}
            if generation is not None and generation.status == Generation.Status.ERROR
            else None
        ),
    }


def conversation_json(conversation: Conversation, messages: list[Message]) -> dict[str, Any]:
    return {
        "id": conversation.pk,
        "title": conversation.title,
        "system_prompt": conversation.system_prompt,
        "model_id": conversation.model_id,
        "preset_id": conversation.preset_id,
        "created_at": conversation.created_at.isoformat(),
        "updated_at": conversation.updated_at.isoformat(),
        "messages": [message_json(m) for m in messages],
    }


def generation_json(generation: Generation) -> dict[str, Any]:
    saved = generation.prompt
    prompt = prompt_record(
        generation.prompt_text,
        saved.get("spans", []),
        saved.get("tokens", []),
        saved.get("images", []),
        saved.get("dropped_reasoning", []),
        saved.get("num_dropped_messages", 0),
    )
    error = (
        {"code": generation.error_code, "message": without_server_paths(generation.error_message)}
        if generation.status == Generation.Status.ERROR
        else None
    )
    return {
        "id": generation.pk,
        "kind": generation.kind,
        "status": generation.status,
        "params": generation.params,
        "prompt": prompt,
        "text": generation.text,
        "finish_reason": generation.finish_reason,
        "error": error,
        "stats": generation.stats,
        "steps": generation.steps,
    }


# Views -----------------------------------------------------------------------------------


@endpoint("GET")
def model_list(request: HttpRequest) -> HttpResponse:
    rows = LanguageModel.objects.select_related("default_chat_template").filter(is_enabled=True)
    default = default_model().model
    return JsonResponse(
        [
            {
                "id": m.pk,
                "name": m.name,
                # the model a request without a choice gets: SmolLM2 when the default could not be prepared here
                "is_default": default is not None and m.pk == default.pk,
                "max_context": m.max_context,
                "default_system_prompt": model_default_system_prompt(m),
                "accepts_images": accepts_images(m),
                "summary": summary(m),
                "unavailable": unavailable_reason(m),
            }
            for m in rows
        ],
        safe=False,
    )


@endpoint("GET")
def preset_list(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        [
            {"id": p.pk, "name": p.name, "is_default": p.is_default, "params": p.to_sampling_params().to_dict()}
            for p in SamplingPreset.objects.all()
        ],
        safe=False,
    )


def _apply_fields(conversation: Conversation, body: dict[str, Any]) -> None:
    """Sets the editable fields present in `body` (null model/preset: back to the default)."""
    for name in ("title", "system_prompt"):
        if name in body:
            setattr(conversation, name, get_field(body, name, str, default=""))
    max_title = Conversation._meta.get_field("title").max_length
    if len(conversation.title) > max_title:
        raise CommandError(
            "invalid_field",
            gettext("title has %(count)s characters; at most %(limit)s")
            % {"count": len(conversation.title), "limit": max_title},
        )
    limits.check_prompt_chars(len(conversation.system_prompt))
    if "model_id" in body:
        model_id = get_field(body, "model_id", int)
        conversation.model = None if model_id is None else resolve_model(model_id)
    if "preset_id" in body:
        preset_id = get_field(body, "preset_id", int)
        conversation.preset = None if preset_id is None else resolve_preset(preset_id)


@endpoint("GET", "POST")
def conversation_list(request: HttpRequest) -> HttpResponse:
    owner = owners.request_owner(request)
    if request.method == "POST":
        if owner is None:
            raise CommandError(
                "no_session", gettext("conversations belong to a browser session: load a page of this site first")
            )
        conversation = Conversation(owner=owner)
        _apply_fields(conversation, _body(request))
        conversation.save()
        return JsonResponse(conversation_json(conversation, []), status=201)
    rows = Conversation.objects.filter(owner=owner).order_by("-updated_at") if owner else Conversation.objects.none()
    return JsonResponse(
        [{"id": c.pk, "title": c.title, "updated_at": c.updated_at.isoformat()} for c in rows], safe=False
    )


@endpoint("GET", "PATCH", "DELETE")
def conversation_detail(request: HttpRequest, conversation_id: int) -> HttpResponse:
    row = owned_conversation(owned_by(request), conversation_id)
    if request.method == "DELETE":
        active = row.generations.filter(status__in=Generation.ACTIVE_STATUSES)
        for generation_id in active.values_list("pk", flat=True):
            cancel.request_cancel(generation_id)  # no worker time for an answer nobody will read
        row.delete()
        return HttpResponse(status=204)
    if request.method == "PATCH":
        _apply_fields(row, _body(request))
        row.save()
    liveness.reconcile(row.generations.filter(status__in=Generation.ACTIVE_STATUSES))
    messages = row.active_messages().select_related("generation")
    return JsonResponse(conversation_json(row, list(messages)))


@endpoint("GET")
def generation_detail(request: HttpRequest, generation_id: int) -> HttpResponse:
    row = owned_generation(owned_by(request), generation_id)
    if row.is_active and liveness.mark_lost_if_stale(row):
        row.refresh_from_db()
    return JsonResponse(generation_json(row))
