"""A generation's prompt, built by the worker from its records: the Django <-> prompt-builder bridge.

Owns: which messages a chat's prompt is made of (the system prompt, the newest
`PLAYGROUND_MAX_MESSAGES` active messages before the answer, with their images; a turn refused as
too long left out), shortening a chat that outgrew the limits (its oldest whole turns, a binary
search), the raw completion's text and branch tokens, the limits' last check (tokens) and the
prompt's record as the page shows it. Runs on the generation's task thread (the engine's thread
keeps stepping the batch meanwhile). Must not know: the stream, the engine loop, saving.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from inference.text.prompt import Prompt, PromptError
from playground import limits, protocol
from playground.images import prompt_images
from playground.models import Generation, Message
from playground.protocol import CommandError

if TYPE_CHECKING:
    from inference.engine import Engine

History = list[tuple[dict[str, str], list[dict[str, Any]]]]  # (message, its image records), oldest first


@dataclass(frozen=True)
class BuiltPrompt:
    """A prompt as the model will see it, with the records of its images in order and how many of
    the chat's oldest messages it left out."""

    prompt: Prompt
    image_records: list[dict[str, Any]]
    num_dropped: int = 0

    def record(self, engine: Engine) -> dict[str, Any]:
        """The prompt as the page shows it: {text, spans, tokens, images, ...}."""
        prompt, kv_bytes_per_token = self.prompt, engine.info.kv_bytes_per_token
        blocks = [
            protocol.image_block(span.to_dict(), engine.vision.grid, record, span.num_tokens * kv_bytes_per_token)
            for span, record in zip(prompt.image_spans, self.image_records)
        ]
        return protocol.prompt_record(
            prompt.text,
            [span.to_dict() for span in prompt.spans],
            [t.to_dict() for t in prompt.tokens],
            blocks,
            list(prompt.dropped_reasoning),
            num_dropped_messages=self.num_dropped,
        )


def build_prompt(generation: Generation, answer_id: int | None, max_new_tokens: int, engine: Engine) -> BuiltPrompt:
    """The generation's prompt, within the limits (`CommandError` otherwise): a chat that outgrew
    them leaves out its oldest turns (`shortened`), not the new one."""
    template = generation.chat_template.source if generation.chat_template else None
    max_context = engine.info.max_context
    inputs = generation.inputs
    if generation.kind == Generation.Kind.CHAT:
        system, history, num_dropped = chat_history(generation, answer_id, engine)

        def build(first: int) -> BuiltPrompt:
            kept = history[first:]
            image_records = [image for _, message_images in kept for image in message_images]
            messages = system + [message for message, _ in kept]
            return _build(
                generation, engine, template, messages, "", [], image_records, num_dropped + first, inputs.get("tools")
            )

        built = build(0)
        if not limits.prompt_fits(len(built.prompt.tokens), max_context):
            built = shortened(build, history, limits.history_budget(max_context, max_new_tokens))
    else:
        image_records = inputs.get("images", [])
        text = engine.prompts.with_image_placeholders(inputs["text"], len(image_records))
        if inputs.get("chat"):
            built = _build(generation, engine, template, [{"role": "user", "content": text}], "", [], image_records)
        else:  # raw completion: the text as it is (after its images' placeholders)
            built = _build(generation, engine, template, None, text, inputs.get("token_ids", []), image_records)
    limits.check_prompt_tokens(len(built.prompt.tokens), max_context)
    return built


def _build(
    generation: Generation,
    engine: Engine,
    template: str | None,
    messages: list[dict[str, str]] | None,
    text: str,
    token_ids: list[int],
    image_records: list[dict[str, Any]],
    num_dropped: int = 0,
    tools: list[dict[str, Any]] | None = None,
) -> BuiltPrompt:
    """Chat `messages` rendered (None: the raw `text`), tokenized, then `token_ids`, with each
    image's block of tokens (`engine.prompts.build`); checked there. `tools` (the API's function
    definitions) go to the template as its `tools`."""
    if image_records and engine.vision is None:
        raise CommandError("images_not_supported", f"model {generation.model.name!r} takes no images")
    images = prompt_images(image_records) if image_records else []
    try:
        extra = {"tools": tools} if tools else {}  # only when there are: the template's `tools` stays None
        prompt = engine.prompts.build(
            messages=messages, text=text, template=template, extra_token_ids=token_ids, images=images, **extra
        )
    except PromptError as exc:
        raise CommandError(exc.code, str(exc)) from exc
    return BuiltPrompt(prompt, image_records, num_dropped)


def shortened(build: Callable[[int], BuiltPrompt], history: History, budget: int) -> BuiltPrompt:
    """The chat without its oldest turns (whole turns: each cut is at a user message), as few as
    bring it within `budget` tokens (`limits.history_budget`: room for an answer); at most all but
    the new message. A binary search: a few renders, whatever the length of the conversation."""
    cuts = [i for i in range(1, len(history)) if history[i][0]["role"] == Message.Role.USER]
    if not cuts:
        return build(0)
    low, high = 0, len(cuts) - 1  # the answer is the first cut that fits, else the last one
    best: BuiltPrompt | None = None
    while low <= high:
        middle = (low + high) // 2
        built = build(cuts[middle])
        if len(built.prompt.tokens) <= budget:
            best, high = built, middle - 1
        else:
            low = middle + 1
    return best or build(cuts[-1])


def chat_history(
    generation: Generation, answer_id: int | None, engine: Engine
) -> tuple[list[dict[str, str]], History, int]:
    """The system prompt (as a list of 0 or 1 message), then each active message before the
    generation's answer with its images (placeholders before its text), then how many older ones
    were left out: only the newest `PLAYGROUND_MAX_MESSAGES` are read, so a conversation's length
    bounds no render. A turn whose answer was refused as too long never reached the model: it is
    left out, so it cannot make every later turn too long as well."""
    conversation = generation.conversation
    answer = Message.objects.get(pk=answer_id)
    system = [{"role": "system", "content": conversation.system_prompt}] if conversation.system_prompt else []
    history: History = []
    before = conversation.active_messages().filter(position__lt=answer.position)
    num_before = before.count()
    newest = before.select_related("generation").order_by("-position", "-created_at")
    for message in list(newest[: settings.PLAYGROUND_MAX_MESSAGES])[::-1]:
        if message.role == Message.Role.ASSISTANT and not message.content:
            refused = message.generation is not None and message.generation.error_code == "prompt_too_long"
            if refused and history and history[-1][0]["role"] == Message.Role.USER:
                history.pop()
            continue  # an answer that failed before its first token: an empty turn confuses templates
        content = engine.prompts.with_image_placeholders(message.content, len(message.images))
        history.append(({"role": message.role, "content": content}, message.images))
    num_dropped = max(0, num_before - settings.PLAYGROUND_MAX_MESSAGES)
    while num_dropped and len(history) > 1 and history[0][0]["role"] != Message.Role.USER:
        history.pop(0)  # a cut history starts at a user's turn, as `shortened` cuts it
        num_dropped += 1
    return system, history, num_dropped
