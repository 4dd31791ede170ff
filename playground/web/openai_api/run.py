"""One API request from the queued row to its answer: submit, enqueue, follow, and the
answer as a whole (non-streaming) or as server-sent events.

Owns: the order (join the group, then queue; wait for `generation.started` before answering,
so a prompt the worker refuses is still an HTTP error), the chunk sequence of a stream, and
the cancel of a generation whose client went away. Must not know: request parsing (`request`),
the shapes' details (`shapes`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from channels.db import database_sync_to_async

from inference.text.reasoning import prompt_opens_reasoning
from playground import dispatch
from playground.coord.store import OUTAGE_ERRORS, OUTAGE_MESSAGE
from playground.models import LanguageModel, SamplingPreset
from playground.protocol import CommandError
from playground.web import submit
from playground.web.inspect_api import ask_worker
from playground.web.openai_api import shapes
from playground.web.openai_api.answer import Answer, Delta
from playground.web.openai_api.errors import ApiError, from_command_error, from_event
from playground.web.openai_api.follow import Follower
from playground.web.openai_api.request import ApiRequest

logger = logging.getLogger(__name__)

# A stream holds its latest content chunk back this long, so that the finish reason can ride
# on the last content chunk when the generation ends meanwhile.
HOLD_CHUNK_S = 0.1
DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class ApiRun:
    def __init__(self, request: ApiRequest, owner: str, max_concurrent: int | None, is_chat: bool) -> None:
        self.request, self.owner, self.max_concurrent, self.is_chat = request, owner, max_concurrent, is_chat
        self.created = int(time.time())
        self.submitted_at = time.monotonic()
        self.queue_ms: float | None = None
        self.follower: Follower | None = None
        self.prompt_text = ""
        self.answer = Answer(split_reasoning=is_chat)
        self.finished: dict[str, Any] | None = None
        self.prompt_tokens: list[dict[str, Any]] | None = None  # echo + logprobs: the prompt's own

    @property
    def id(self) -> str:
        prefix = "chatcmpl" if self.is_chat else "cmpl"
        return f"{prefix}-{self.follower.generation_id if self.follower else 0}"

    # ---- start ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Creates the row, joins its group, queues it, and waits until a worker started it."""
        queued = await database_sync_to_async(self._submit)()
        self.follower = Follower(queued.generation_id)
        try:
            await self.follower.join()
            await database_sync_to_async(dispatch.enqueue)(queued.generation_id, None, queued.conversation_id)
        except OUTAGE_ERRORS as exc:
            await database_sync_to_async(submit.fail)(queued.generation_id, "service_unavailable", OUTAGE_MESSAGE)
            raise ApiError(OUTAGE_MESSAGE, code="service_unavailable", status=503) from exc
        except Exception as exc:
            logger.exception("generation %s could not be queued", queued.generation_id)
            await database_sync_to_async(submit.fail)(
                queued.generation_id, "internal_error", f"the task queue is unreachable: {exc}"
            )
            raise ApiError(f"the task queue is unreachable: {exc}", code="internal_error", status=503) from exc
        async for event in self.follower.events():
            if self._on_event(event) == "started":
                return

    def _submit(self) -> submit.Queued:
        request = self.request
        model = LanguageModel.objects.filter(name=request.model).first()
        if model is None:
            names = ", ".join(LanguageModel.objects.filter(is_enabled=True).values_list("name", flat=True))
            raise ApiError(
                f"the model {request.model!r} does not exist; available: {names}",
                param="model",
                code="model_not_found",
                status=404,
            )
        content: dict[str, Any] = {"model_id": model.pk, "overrides": request.overrides}
        if request.preset is not None:
            preset = SamplingPreset.objects.filter(name=request.preset).first()
            if preset is None:
                raise ApiError(
                    f"the preset {request.preset!r} does not exist", param="preset", code="not_found", status=404
                )
            content["preset_id"] = preset.pk
        try:
            if self.is_chat:
                return submit.api_chat(self.owner, content, request.messages, self.max_concurrent)
            content.update(text=request.prompt_text, token_ids=request.prompt_token_ids)
            return submit.api_complete(self.owner, content, self.max_concurrent)
        except CommandError as exc:
            raise from_command_error(exc) from exc

    def _on_event(self, event: dict[str, Any] | None) -> str | None:
        """Keeps what the answer needs; returns "started", "tokens", "end" or None."""
        kind = event and event.get("type")
        if kind == "generation.started":
            self.queue_ms = (time.monotonic() - self.submitted_at) * 1000
            self.prompt_text = event["prompt"]["text"]
            self.answer.starts_in_reasoning = self.is_chat and prompt_opens_reasoning(self.prompt_text)
            return "started"
        if kind == "generation.finished":
            self.finished = event
            return "end"
        if kind == "generation.error":
            raise from_event(event)
        return "tokens" if kind == "generation.tokens" else None

    async def close(self) -> None:
        if self.follower is not None:
            await self.follower.close()

    # ---- non-streaming --------------------------------------------------------------------

    async def collect(self) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        async for event in self.follower.events():
            if self._on_event(event) == "tokens":
                steps.extend(event["steps"])
        self.answer.add(steps)
        self.answer.finish(self.finished["text"])
        if self.is_chat:
            return self._chat_completion()
        if self.request.echo and self.request.num_logprobs is not None:
            self.prompt_tokens = await self._prompt_logprobs()
        return self._text_completion()

    async def _prompt_logprobs(self) -> list[dict[str, Any]]:
        """The prompt's own logprobs, recomputed by a worker (`inspection` view "prompt_logprobs")."""
        checked = {
            "view": "prompt_logprobs",
            "step": 0,
            "layer": None,
            "top_n": self.request.num_logprobs,
            "params": {},
        }
        try:
            return (await ask_worker(self.follower.generation_id, checked))["tokens"]
        except CommandError as exc:
            raise from_command_error(exc) from exc

    def _stats(self) -> dict[str, Any]:
        return self.finished.get("stats") or {}

    def _extras(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.request.timings:
            body["timings"] = shapes.timings(self._stats(), self.queue_ms)
        return body

    def _usage(self) -> dict[str, Any]:
        return shapes.usage(self._stats(), len(self.answer.reasoning_steps()))

    def _chat_completion(self) -> dict[str, Any]:
        reasoning, content = self.answer.final_parts()
        k = self.request.num_logprobs
        choice = {
            "index": 0,
            "message": shapes.chat_message(content, reasoning),
            "logprobs": None
            if k is None
            else shapes.chat_logprobs(
                self.answer.content_steps(), self.answer.reasoning_steps(), k, self.request.raw_logprobs
            ),
            "finish_reason": shapes.finish_reason(self.finished["finish_reason"]),
        }
        body = shapes.envelope("chat.completion", self.id, self.created, self.request.model)
        return self._extras({**body, "choices": [choice], "usage": self._usage()})

    def _text_completion(self) -> dict[str, Any]:
        prefix = self.prompt_text if self.request.echo else ""
        k, is_score_only = self.request.num_logprobs, self.request.is_score_only
        steps = [] if is_score_only else self.answer.steps
        logprobs = None
        if k is not None:
            logprobs = shapes.completion_logprobs(steps, k, len(prefix), self.request.raw_logprobs)
            if self.prompt_tokens is not None:
                logprobs = shapes.join_logprobs(shapes.prompt_completion_logprobs(self.prompt_tokens), logprobs)
        choice = {
            "index": 0,
            "text": prefix + ("" if is_score_only else self.answer.text),
            "logprobs": logprobs,
            "finish_reason": "length" if is_score_only else shapes.finish_reason(self.finished["finish_reason"]),
        }
        body = shapes.envelope("text_completion", self.id, self.created, self.request.model)
        usage = self._usage()
        if is_score_only:
            usage = {**usage, "completion_tokens": 0, "total_tokens": usage["prompt_tokens"]}
        return self._extras({**body, "choices": [choice], "usage": usage})

    # ---- streaming ------------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[bytes]:
        """The server-sent events; the generation is cancelled if the client leaves before its end."""
        try:
            async for data in self._stream():
                yield data
        finally:
            await self.close()

    async def _stream(self) -> AsyncIterator[bytes]:
        if self.is_chat:
            yield sse(self._chunk(shapes.chunk_delta("", None, role=True), None))
        elif self.request.echo:
            yield sse(self._chunk(self.prompt_text, None))
        held: tuple[Delta, float] | None = None  # the latest content chunk and when it was made
        try:
            async for event in self.follower.events(tick_s=HOLD_CHUNK_S / 2):
                kind = self._on_event(event)
                if kind == "tokens":
                    delta = self.answer.add(event["steps"])
                    if held is not None:
                        yield sse(self._delta_chunk(held[0], None))
                    held = (delta, time.monotonic()) if not delta.is_empty() else None
                elif held is not None and time.monotonic() - held[1] >= HOLD_CHUNK_S:
                    yield sse(self._delta_chunk(held[0], None))
                    held = None
        except ApiError as exc:  # the generation failed: after the headers, an error event ends it
            yield exc.sse()
            yield DONE
            return
        last = self.answer.finish(self.finished["text"])
        if held is not None:  # the rest of the text joins the held chunk, which carries the reason
            held[0].reasoning += last.reasoning
            held[0].content += last.content
            last = held[0]
        yield sse(self._delta_chunk(last, shapes.finish_reason(self.finished["finish_reason"])))
        if self.request.include_usage or self.request.timings:
            body = {**self._chunk(None, None), "choices": []}
            body["usage"] = self._usage() if self.request.include_usage else None
            yield sse(self._extras(body))
        yield DONE

    def _delta_chunk(self, delta: Delta, finish_reason: str | None) -> dict[str, Any]:
        k = self.request.num_logprobs
        if self.is_chat:
            logprobs = (
                None
                if k is None
                else shapes.chat_logprobs(delta.content_steps, delta.reasoning_steps, k, self.request.raw_logprobs)
            )
            return self._chunk(shapes.chunk_delta(delta.content, delta.reasoning), finish_reason, logprobs)
        offset = (len(self.prompt_text) if self.request.echo else 0) + delta.text_offset
        logprobs = None
        if k is not None:
            logprobs = shapes.completion_logprobs(delta.content_steps, k, offset, self.request.raw_logprobs)
        return self._chunk(delta.content, finish_reason, logprobs)

    def _chunk(self, delta: Any, finish_reason: str | None, logprobs: Any = None) -> dict[str, Any]:
        if self.is_chat:
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return {
                **shapes.envelope("chat.completion.chunk", self.id, self.created, self.request.model),
                "choices": [choice],
            }
        choice = {"index": 0, "text": delta or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return {**shapes.envelope("text_completion", self.id, self.created, self.request.model), "choices": [choice]}
