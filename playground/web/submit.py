"""What the generation commands do to the records (sync, ORM): validate, then create the
messages and the queued `Generation` in one transaction.

Owns: the conversation bookkeeping behind generate / regenerate / edit / complete / stop,
and which model, preset and template apply. Every refusal is a `CommandError` raised
before anything is written. Must not know: sockets, channel layers, Celery.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from django.utils.translation import gettext

from inference.sampling_params import PROMPT_LOOKUP, SPECULATIVE_OFF, SamplingParams
from playground import limits
from playground.choices import choice_params
from playground.coord import cancel, liveness
from playground.images import parse_images
from playground.model_choice import default_model, unavailable_reason
from playground.models import ChatTemplate, Conversation, Generation, LanguageModel, Message, SamplingPreset
from playground.protocol import CommandError, get_field, get_id_list
from playground.web.architecture import accepts_images

_TITLE_CHARS = 60
# Regenerate under a greedy preset samples at this temperature: greedy would repeat the answer
# word for word (and Greedy is the default preset). The preset's filters (top-k/p ...) stay.
REGENERATE_TEMPERATURE = 0.8


@dataclass(frozen=True)
class Queued:
    """A generation that was created and must now be enqueued."""

    generation_id: int
    conversation_id: int | None = None
    user_message_id: int | None = None
    message_id: int | None = None


def submit(command: str, owner: str, content: dict[str, Any]) -> Queued:
    """Runs one of the generating commands (see COMMANDS)."""
    return COMMANDS[command](owner, content)


# Lookups ---------------------------------------------------------------------------------


def owned_conversation(owner: str, conversation_id: int) -> Conversation:
    conversation = Conversation.objects.filter(pk=conversation_id, owner=owner).first()
    if conversation is None:
        raise CommandError("not_found", gettext("conversation %(id)s does not exist") % {"id": conversation_id})
    return conversation


def owned_generation(owner: str, generation_id: int) -> Generation:
    generation = Generation.objects.filter(pk=generation_id, owner=owner).first()
    if generation is None:
        raise CommandError("not_found", gettext("generation %(id)s does not exist") % {"id": generation_id})
    return generation


def _active_message(owner: str, content: dict[str, Any], role: str) -> Message:
    message_id = get_field(content, "message_id", int, required=True)
    message = (
        Message.objects.select_related("conversation")
        .filter(pk=message_id, conversation__owner=owner, is_active=True)
        .first()
    )
    if message is None:
        raise CommandError("not_found", gettext("message %(id)s does not exist (or was replaced)") % {"id": message_id})
    if message.role != role:
        raise CommandError("invalid_field", f"message {message_id} is a {message.role} message, not a {role} message")
    return message


def resolve_model(model_id: int | None, fallback: LanguageModel | None = None) -> LanguageModel:
    """The named model, else `fallback`, else the default (SmolLM2 when the default is a bundled
    model this host could not prepare); it must be enabled and able to answer here."""
    if model_id is not None:
        model = LanguageModel.objects.filter(pk=model_id).first()
        if model is None:
            raise CommandError("not_found", gettext("model %(id)s does not exist") % {"id": model_id})
    else:
        model = fallback or default_model().model
    if model is None:
        raise CommandError("model_unavailable", gettext("no model is configured: add one in the admin"))
    if not model.is_enabled:
        raise CommandError("model_unavailable", gettext("model %(name)r is disabled") % {"name": model.name})
    reason = unavailable_reason(model)
    if reason is not None:
        raise CommandError("model_unavailable", reason)
    return model


def resolve_preset(preset_id: int | None, fallback: SamplingPreset | None = None) -> SamplingPreset | None:
    if preset_id is None:
        return fallback or SamplingPreset.default()
    preset = SamplingPreset.objects.filter(pk=preset_id).first()
    if preset is None:
        raise CommandError("not_found", gettext("preset %(id)s does not exist") % {"id": preset_id})
    return preset


def _choices(
    content: dict[str, Any],
    conversation: Conversation | None = None,
    *,
    is_regenerate: bool = False,
) -> tuple[LanguageModel, SamplingPreset | None, SamplingParams]:
    """The model, preset and resolved params for one command (the conversation's as fallback).
    A regenerate under a greedy preset samples (REGENERATE_TEMPERATURE) unless the command itself
    asks for greedy (a `temperature` or `greedy` override): another answer is what it is for."""
    model = resolve_model(get_field(content, "model_id", int), conversation and conversation.model)
    preset = resolve_preset(get_field(content, "preset_id", int), conversation and conversation.preset)
    overrides = get_field(content, "overrides", dict, default={})
    overrides = SamplingParams.resolve_overrides(overrides)  # the default preset is greedy
    try:
        params = preset.to_sampling_params(**overrides) if preset else SamplingParams.from_dict(overrides)
    except (TypeError, ValueError) as exc:
        raise CommandError("invalid_params", str(exc)) from exc
    # "greedy" is in the overrides when the command asked for it, or set a temperature.
    if is_regenerate and params.is_greedy and params.num_beams == 1 and "greedy" not in overrides:
        params = replace(params, greedy=False, temperature=REGENERATE_TEMPERATURE)
    limits.check_params(params)
    _check_draft(params, model)
    return model, preset, params


def _check_draft(params: SamplingParams, model: LanguageModel) -> None:
    """`speculative` names what proposes tokens: off, prompt_lookup, or another enabled model
    record (the draft). Checked against the records here, before anything is written; the
    worker's engine has the last word (a draft it cannot load fails the generation, naming
    `speculative`). The message starts with the field, so /v1 names it as `param`."""
    name = params.speculative
    if name in (SPECULATIVE_OFF, PROMPT_LOOKUP):
        return
    drafts = LanguageModel.objects.filter(is_enabled=True).exclude(pk=model.pk)
    if drafts.filter(name=name).exists():
        return
    known = ", ".join(repr(n) for n in [SPECULATIVE_OFF, PROMPT_LOOKUP, *drafts.values_list("name", flat=True)])
    why = "is the model that answers" if name == model.name else "is not an enabled model"
    raise CommandError(
        "invalid_params", f"speculative={name!r} {why}: it must be one of {known} (another model drafts the tokens)"
    )


def _check_images(
    model: LanguageModel,
    images: list[dict[str, Any]] | None,
    conversation: Conversation | None = None,
    before_position: int | None = None,
) -> None:
    """A text-only model is refused images (the new ones, or earlier messages' in a chat)
    before anything is written: the worker would fail the generation after the rows exist."""
    has_images = bool(images)
    if not has_images and conversation is not None and conversation.pk is not None:
        earlier = conversation.active_messages().filter(images__0__isnull=False)
        if before_position is not None:
            earlier = earlier.filter(position__lt=before_position)
        has_images = earlier.exists()
    if has_images and accepts_images(model) is False:
        message = (
            gettext("model %(name)r takes no images (this message has some): choose a vision-language model")
            if images
            else gettext("model %(name)r takes no images (the conversation has some): choose a vision-language model")
        )
        raise CommandError("images_not_supported", message % {"name": model.name})


def _text(content: dict[str, Any], name: str) -> str:
    text = get_field(content, name, str, required=True)
    if not text.strip():
        raise CommandError("invalid_field", gettext("%(name)s must not be empty") % {"name": name})
    return text


def _template(model: LanguageModel, conversation: Conversation | None = None) -> ChatTemplate | None:
    return (conversation and conversation.chat_template) or model.default_chat_template


# Conversation bookkeeping ----------------------------------------------------------------


def _check_chars(conversation: Conversation, before_position: int | None, *texts: str) -> None:
    """The cheap character check on everything that will go into the prompt."""
    num_chars = sum(len(text) for text in texts)
    if conversation.pk is not None:  # a new conversation has no messages yet
        messages = conversation.active_messages()
        if before_position is not None:
            messages = messages.filter(position__lt=before_position)
        num_chars += sum(len(text) for text in messages.values_list("content", flat=True))
    limits.check_prompt_chars(num_chars)


def _supersede(conversation: Conversation, from_position: int) -> None:
    """Deactivates the messages from `from_position` on; their records stay."""
    conversation.messages.filter(is_active=True, position__gte=from_position).update(is_active=False)


def _queue_answer(
    owner: str,
    conversation: Conversation,
    position: int,
    model: LanguageModel,
    params: SamplingParams,
    user_message: Message | None,
    is_active: bool = True,
    inputs: dict[str, Any] | None = None,
) -> Queued:
    """Creates the queued chat generation and its (empty) assistant message at `position`
    (`is_active` false: another choice beside the active one). Runs inside the command's
    transaction after its limit check, so a refusal writes nothing."""
    generation = Generation.objects.create(
        kind=Generation.Kind.CHAT,
        owner=owner,
        conversation=conversation,
        model=model,
        chat_template=_template(model, conversation),
        params=params.to_dict(),
        inputs=inputs or {},
    )
    answer = Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        position=position,
        generation=generation,
        is_active=is_active,
    )
    conversation.save(update_fields=["updated_at"])
    return Queued(generation.pk, conversation.pk, user_message and user_message.pk, answer.pk)


# Commands --------------------------------------------------------------------------------


def generate(owner: str, content: dict[str, Any]) -> Queued:
    """Appends a user message to a conversation (a new one without `conversation_id`) and answers it."""
    text = _text(content, "content")
    images = parse_images(content)
    conversation_id = get_field(content, "conversation_id", int)
    system_prompt = get_field(content, "system_prompt", str)
    with transaction.atomic():
        if conversation_id is None:
            conversation = Conversation(owner=owner, title=text.strip()[:_TITLE_CHARS])
        else:
            conversation = owned_conversation(owner, conversation_id)
        if system_prompt is not None:
            conversation.system_prompt = system_prompt
        model, preset, params = _choices(content, conversation)
        _check_images(model, images, conversation)
        _check_chars(conversation, None, conversation.system_prompt, text)
        if conversation.pk is None:  # a new conversation remembers what it started with
            conversation.model, conversation.preset = model, preset
        conversation.save()
        last = conversation.active_messages().aggregate(last=Max("position"))["last"]
        position = 0 if last is None else last + 1
        user_message = Message.objects.create(
            conversation=conversation, role=Message.Role.USER, content=text, images=images, position=position
        )
        limits.check_concurrency(owner)
        return _queue_answer(owner, conversation, position + 1, model, params, user_message)


def regenerate(owner: str, content: dict[str, Any]) -> Queued:
    """Answers the user message before an assistant message again; the old answer stays on record
    (under a greedy preset, sampled: see `_choices`)."""
    with transaction.atomic():
        old_answer = _active_message(owner, content, Message.Role.ASSISTANT)
        conversation = old_answer.conversation
        model, _, params = _choices(content, conversation, is_regenerate=True)
        _check_images(model, None, conversation, old_answer.position)
        _check_chars(conversation, old_answer.position, conversation.system_prompt)
        _supersede(conversation, old_answer.position)
        limits.check_concurrency(owner)
        return _queue_answer(owner, conversation, old_answer.position, model, params, None)


def edit(owner: str, content: dict[str, Any]) -> Queued:
    """Rewrites a user message, drops what came after it, and answers it (with the images sent
    along, or, when the command names none, the old message's)."""
    text = _text(content, "content")
    images = parse_images(content) if "images" in content else None
    with transaction.atomic():
        old_question = _active_message(owner, content, Message.Role.USER)
        conversation = old_question.conversation
        model, _, params = _choices(content, conversation)
        _check_images(model, old_question.images if images is None else images, conversation, old_question.position)
        _check_chars(conversation, old_question.position, conversation.system_prompt, text)
        _supersede(conversation, old_question.position)
        user_message = Message.objects.create(
            conversation=conversation,
            role=Message.Role.USER,
            content=text,
            images=old_question.images if images is None else images,
            position=old_question.position,
        )
        limits.check_concurrency(owner)
        return _queue_answer(owner, conversation, old_question.position + 1, model, params, user_message)


def complete(owner: str, content: dict[str, Any]) -> Queued:
    """A raw completion for the explorer: no conversation, no messages."""
    text = get_field(content, "text", str, required=True)
    is_chat = get_field(content, "chat", bool, default=False)
    token_ids = get_id_list(content, "token_ids")
    if not text and not token_ids:
        raise CommandError("invalid_field", gettext("%(name)s must not be empty") % {"name": "text"})
    images = parse_images(content)
    limits.check_prompt_chars(len(text))
    model, _, params = _choices(content)
    _check_images(model, images)
    with transaction.atomic():
        limits.check_concurrency(owner)
        return _queue_completion(owner, model, params, text, token_ids, is_chat, images)


def _queue_completion(
    owner: str,
    model: LanguageModel,
    params: SamplingParams,
    text: str,
    token_ids: list[int],
    is_chat: bool,
    images: list[dict[str, Any]] | None = None,
) -> Queued:
    """The queued row of a raw completion (no conversation); `images` go before the text
    (playground/images.py's records). Runs inside the command's transaction after its limit check."""
    generation = Generation.objects.create(
        kind=Generation.Kind.COMPLETE,
        owner=owner,
        model=model,
        chat_template=_template(model),
        params=params.to_dict(),
        inputs={"text": text, "chat": is_chat, "token_ids": token_ids, "images": images or []},
    )
    return Queued(generation.pk)


def stop(owner: str, content: dict[str, Any]) -> Generation | None:
    """Asks the worker to stop; a generation still in the queue ends here (returned, ended)."""
    generation = owned_generation(owner, get_field(content, "generation_id", int, required=True))
    if not generation.is_active:
        return None
    cancel.request_cancel(generation.pk)
    num_updated = Generation.objects.filter(pk=generation.pk, status=Generation.Status.QUEUED).update(
        status=Generation.Status.CANCELLED, finish_reason="cancelled", finished_at=timezone.now()
    )
    if not num_updated:
        return None  # the worker has it: it stops within one step and reports
    generation.refresh_from_db()
    return generation


def attach(owner: str | None, content: dict[str, Any]) -> Generation:
    """The owner's own generation that a reloaded page wants to follow (after the lost rule
    has been applied, so a dead worker's generation reads as ended)."""
    generation_id = get_field(content, "generation_id", int, required=True)
    if owner is None:
        raise CommandError("not_found", gettext("generation %(id)s does not exist") % {"id": generation_id})
    generation = owned_generation(owner, generation_id)
    liveness.reconcile([generation])
    generation.refresh_from_db()
    return generation


def fail(generation_id: int, code: str, message: str) -> Generation | None:
    """Ends a generation that never reached a worker (e.g. the queue was unreachable)."""
    num_updated = Generation.objects.filter(pk=generation_id, status=Generation.Status.QUEUED).update(
        status=Generation.Status.ERROR,
        finish_reason="error",
        error_code=code,
        error_message=message,
        finished_at=timezone.now(),
    )
    return Generation.objects.get(pk=generation_id) if num_updated else None


COMMANDS = {"generate": generate, "regenerate": regenerate, "edit": edit, "complete": complete}


# The OpenAI-compatible API (web/openai_api) -----------------------------------------------
#
# An API client has no browser session: its owner id (its key's record, or the local client's;
# playground/web/owners.py, via `openai_api.auth.Client.owner`) files its rows, so the limits and
# the admin's records work as for the browser. A chat becomes a conversation of its own whose messages are
# the request's, which the worker renders like any other chat (no worker change), and each
# answer is saved as its assistant message. `num_choices` (`n`) makes that many generations of
# one prompt, a unit (choice i samples with `choices.choice_params`); a unit's choices are
# created in order, so the client's turns (`openai_api.turns`) take them together.


def api_chat(
    owner: str, content: dict[str, Any], messages: list[dict[str, str]], num_choices: int, max_concurrent: int
) -> list[Queued]:
    """The choices answering `messages` ({role, content}, roles system/user/assistant/tool), in order;
    `content` holds model_id, preset_id and overrides as the WebSocket commands do, and the API's
    `tools` (kept in each generation's `inputs` for its template). The first choice's answer is the
    conversation's active one, the others stand beside it."""
    if not messages:
        raise CommandError("invalid_field", "messages must not be empty")
    limits.check_num_messages(len(messages))
    first_user = next((m["content"] for m in messages if m["role"] == Message.Role.USER), "")
    with transaction.atomic():
        conversation = Conversation(owner=owner, title=first_user.strip()[:_TITLE_CHARS] or "API chat")
        model, preset, params = _choices(content)
        _check_choices(params, num_choices)
        _check_chars(conversation, None, *(m["content"] for m in messages))
        limits.check_api_backlog(owner, num_choices, max_concurrent)
        conversation.model, conversation.preset = model, preset
        conversation.save()
        Message.objects.bulk_create(  # one INSERT: a thousand messages cost the web process no second
            Message(conversation=conversation, role=message["role"], content=message["content"], position=position)
            for position, message in enumerate(messages)
        )
        inputs = {"tools": content["tools"]} if content.get("tools") else None
        return [
            _queue_answer(owner, conversation, len(messages), model, choice_params(params, i), None, i == 0, inputs)
            for i in range(num_choices)
        ]


def api_complete(
    owner: str, content: dict[str, Any], prompts: list[tuple[str, list[int]]], num_choices: int, max_concurrent: int
) -> list[list[Queued]]:
    """Raw completions (`complete` without a browser session) of each prompt (text and/or token
    ids): per prompt, its choices in order."""
    for text, token_ids in prompts:
        if not text and not token_ids:
            raise CommandError("invalid_field", "prompt must not be empty")
        limits.check_prompt_chars(len(text))
    model, _, params = _choices(content)
    _check_choices(params, num_choices)
    with transaction.atomic():
        limits.check_api_backlog(owner, len(prompts) * num_choices, max_concurrent)
        return [
            [
                _queue_completion(owner, model, choice_params(params, i), text, token_ids, is_chat=False)
                for i in range(num_choices)
            ]
            for text, token_ids in prompts
        ]


def _check_choices(params: SamplingParams, num_choices: int) -> None:
    if num_choices > 1 and params.is_beam_search:
        raise CommandError(
            "invalid_params", f"n={num_choices} needs sampling; this preset runs beam search, which gives one answer"
        )


def cancel_generation(generation_id: int) -> None:
    """`stop` without the session check: the API client that started it went away."""
    cancel.request_cancel(generation_id)
    Generation.objects.filter(pk=generation_id, status=Generation.Status.QUEUED).update(
        status=Generation.Status.CANCELLED, finish_reason="cancelled", finished_at=timezone.now()
    )
