"""One API request from its queued rows to its answer: submit, wait for the client's turn,
enqueue, follow, and the answer as a whole (non-streaming) or as server-sent events.

A request holds one or more choices (`choice.Choice`, each its own generation): `n` choices
of each prompt (a unit: they run together on one worker), and in `/v1/completions` one unit
per prompt of a list. Choice `i * n + j` is prompt i's choice j, as in OpenAI's API.

Owns: the order (join every group, then queue each unit when its turn comes; wait for every
`generation.started` before answering, so a prompt the worker refuses is still an HTTP error),
the chunk sequence of a stream, usage summed over the choices (each prompt counted once, as
OpenAI does), and the cancel of the generations whose client went away. Must not know: request
parsing (`request`), the shapes' details (`shapes`), the turn rule (`turns`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async

from playground import dispatch, encoded_json, limits
from playground.coord.store import OUTAGE_ERRORS, OUTAGE_MESSAGE
from playground.models import LanguageModel, SamplingPreset
from playground.protocol import CommandError, without_server_paths
from playground.web import submit
from playground.web.inspect_api import ask_worker
from playground.web.openai_api import shapes, tool_calls, turns
from playground.web.openai_api.answer import Delta
from playground.web.openai_api.auth import Client
from playground.web.openai_api.choice import Choice, Item
from playground.web.openai_api.errors import ApiError, from_command_error, invalid
from playground.web.openai_api.request import ApiRequest

logger = logging.getLogger(__name__)

# A stream holds each choice's latest content chunk back this long, so that the finish reason
# can ride on the last content chunk when the generation ends meanwhile. Not the first one: the
# next event comes one coalescing delay later (up to 0.25 s), which the first token would wait.
HOLD_CHUNK_S = 0.1
DONE = b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    return f"data: {encoded_json.dumps(data)}\n\n".encode()  # orjson: a twentieth of json's time


class ApiRun:
    def __init__(self, request: ApiRequest, client: Client, is_chat: bool) -> None:
        self.request, self.client, self.is_chat = request, client, is_chat
        self.created = int(time.time())
        self.arrived_at = time.monotonic()
        self.units: list[list[Choice]] = []  # per prompt, its choices in order
        self.inbox: asyncio.Queue[Item] = asyncio.Queue()
        self._early: list[Item] = []  # what came while other choices were still starting
        self._held_calls: dict[int, Delta] = {}  # per choice: content held while it may be a tool call
        self._free_text: set[int] = set()  # choices whose content is known not to be a tool call

    @property
    def choices(self) -> list[Choice]:
        return [choice for unit in self.units for choice in unit]

    @property
    def id(self) -> str:
        prefix = "chatcmpl" if self.is_chat else "cmpl"
        return f"{prefix}-{self.units[0][0].generation_id if self.units else 0}"

    # ---- start ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Creates the rows, joins their groups, queues each unit in its turn, and waits until
        every choice's worker started it."""
        self._check_size()
        units = await database_sync_to_async(self._submit)()
        n = self.request.num_choices
        on_end = functools.partial(turns.notify, self.client.owner)  # a place is free: waiting units check
        self.units = [
            [
                Choice(i * n + j, queued.generation_id, is_chat=self.is_chat, arrived_at=self.arrived_at, on_end=on_end)
                for j, queued in enumerate(unit)
            ]
            for i, unit in enumerate(units)
        ]
        try:
            for choice in self.choices:
                await choice.join(self.inbox)
        except OUTAGE_ERRORS as exc:
            await self._fail_all([c.generation_id for c in self.choices], "service_unavailable", OUTAGE_MESSAGE)
            raise ApiError(OUTAGE_MESSAGE, code="service_unavailable", status=503) from exc
        for unit in self.units:
            generation_ids = [choice.generation_id for choice in unit]
            await turns.wait_for_turn(self.client.owner, generation_ids, self.client.max_concurrent)
            self._take_early()  # an earlier unit may have failed meanwhile
            await self._enqueue(generation_ids)
        while not all(choice.is_started or choice.has_ended for choice in self.choices):
            self._early.append(await self.inbox.get())
            self._take_early()

    def _check_size(self) -> None:
        """A unit must fit the client's concurrency, and a request its backlog (400: no retry helps)."""
        n, num_prompts = self.request.num_choices, max(len(self.request.prompts), 1)
        if n > self.client.max_concurrent:
            raise invalid(
                "n",
                f"n={n} exceeds this client's concurrency of {self.client.max_concurrent}: "
                "the choices of one prompt run together",
            )
        backlog = limits.max_api_backlog(self.client.max_concurrent)
        if n * num_prompts > backlog:
            raise invalid(
                "prompt" if num_prompts > 1 else "n",
                f"this request asks for {n * num_prompts} generations ({num_prompts} prompts, n={n}); this client may "
                f"have {backlog} queued or running ({self.client.max_concurrent} at once): send fewer per request",
            )

    def _submit(self) -> list[list[submit.Queued]]:
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
        if request.tools:
            content["tools"] = request.tools  # the template renders them (`Generation.inputs`)
        if request.preset is not None:
            preset = SamplingPreset.objects.filter(name=request.preset).first()
            if preset is None:
                raise ApiError(
                    f"the preset {request.preset!r} does not exist", param="preset", code="not_found", status=404
                )
            content["preset_id"] = preset.pk
        try:
            try:
                return self._make_rows(content)
            except CommandError as exc:
                # A full backlog may hold the rows of a web process that died: drop them, try again.
                if exc.code != "too_many_generations" or not turns.cancel_orphans(self.client.owner):
                    raise
                return self._make_rows(content)
        except CommandError as exc:
            raise from_command_error(exc) from exc

    def _make_rows(self, content: dict[str, Any]) -> list[list[submit.Queued]]:
        client, request = self.client, self.request
        if self.is_chat:
            return [
                submit.api_chat(client.owner, content, request.messages, request.num_choices, client.max_concurrent)
            ]
        return submit.api_complete(client.owner, content, request.prompts, request.num_choices, client.max_concurrent)

    async def _enqueue(self, generation_ids: list[int]) -> None:
        try:
            await sync_to_async(dispatch.enqueue_choices, thread_sensitive=False)(generation_ids)
        except OUTAGE_ERRORS as exc:
            await self._fail_all(generation_ids, "service_unavailable", OUTAGE_MESSAGE)
            raise ApiError(OUTAGE_MESSAGE, code="service_unavailable", status=503) from exc
        except Exception as exc:
            logger.exception("generations %s could not be queued", generation_ids)
            message = without_server_paths(f"the task queue is unreachable: {exc}")  # a socket's path, say
            await self._fail_all(generation_ids, "internal_error", message)
            raise ApiError(message, code="queue_unreachable", status=503) from exc

    @staticmethod
    async def _fail_all(generation_ids: list[int], code: str, message: str) -> None:
        for generation_id in generation_ids:
            await database_sync_to_async(submit.fail)(generation_id, code, message)

    def _take_early(self) -> None:
        """Moves what has arrived into `_early`; a choice that failed fails the request."""
        while not self.inbox.empty():
            self._early.append(self.inbox.get_nowait())
        for item in self._early:
            if item.kind == "error":
                raise item.choice.error

    async def close(self) -> None:
        for choice in self.choices:
            await choice.close()
        if self.units:
            await database_sync_to_async(turns.forget)([choice.generation_id for choice in self.choices])
        turns.notify(self.client.owner)

    # ---- non-streaming --------------------------------------------------------------------

    async def collect(self) -> dict[str, Any]:
        remaining = {choice.index for choice in self.choices}
        while remaining:  # every choice ends with one "end" or "error" item
            item = self._early.pop(0) if self._early else await self.inbox.get()
            if item.kind == "error":
                raise item.choice.error
            if item.kind == "end":
                remaining.discard(item.choice.index)
        if self.is_chat:
            return self._chat_completion()
        if self.request.echo and self.request.num_logprobs is not None:
            scored = await asyncio.gather(*(self._prompt_logprobs(unit[0]) for unit in self.units))
            for unit, tokens in zip(self.units, scored, strict=True):
                for choice in unit:  # the choices of one prompt share its logprobs
                    choice.prompt_tokens = tokens
        return self._text_completion()

    async def _prompt_logprobs(self, choice: Choice) -> list[dict[str, Any]]:
        """The prompt's own logprobs, recomputed by a worker (`inspection` view "prompt_logprobs")."""
        checked = {
            "view": "prompt_logprobs",
            "step": 0,
            "layer": None,
            "top_n": self.request.num_logprobs,
            "params": {},
        }
        try:
            return (await ask_worker(choice.generation_id, checked))["tokens"]
        except CommandError as exc:
            raise from_command_error(exc) from exc

    def _usage(self) -> dict[str, Any]:
        """Summed over the choices; each prompt's tokens once (its unit's first choice's)."""
        first_stats = [unit[0].stats for unit in self.units]
        completion = (
            0 if self.request.is_score_only else sum(c.stats.get("num_generated_tokens") or 0 for c in self.choices)
        )
        prediction = None
        if self.request.has_prediction:  # the worker's `Finished` numbers, in each choice's stats
            accepted = sum(c.stats.get("num_accepted_tokens") or 0 for c in self.choices)
            proposed = sum(c.stats.get("num_proposed_tokens") or 0 for c in self.choices)
            prediction = (accepted, max(proposed - accepted, 0))
        return shapes.usage(
            num_prompt_tokens=sum(s.get("num_prompt_tokens") or 0 for s in first_stats),
            num_completion_tokens=completion,
            num_cached_tokens=sum(s.get("num_cached_tokens") or 0 for s in first_stats),
            num_reasoning_tokens=sum(len(c.answer.reasoning_steps()) for c in self.choices),
            prediction=prediction,
        )

    def _timings(self, choice: Choice) -> dict[str, Any]:
        return shapes.timings(choice.stats, choice.queue_ms)

    def _with_extras(self, body: dict[str, Any]) -> dict[str, Any]:
        """The `timings` extra: the first choice's at the top (one choice: the request's)."""
        if self.request.timings:
            body["timings"] = self._timings(self.choices[0])
        return body

    def _choice_timings(self, choice: Choice, body: dict[str, Any]) -> dict[str, Any]:
        """With several choices, each carries its own `timings` too."""
        if self.request.timings and len(self.choices) > 1:
            body["timings"] = self._timings(choice)
        return body

    def _chat_completion(self) -> dict[str, Any]:
        k = self.request.num_logprobs
        choices = []
        for choice in self.choices:
            reasoning, content = choice.answer.final_parts()
            logprobs = None
            if k is not None:
                answer = choice.answer
                logprobs = shapes.chat_logprobs(
                    answer.content_steps(), answer.reasoning_steps(), k, self.request.raw_logprobs
                )
            body = {
                "index": choice.index,
                "message": shapes.chat_message(content, reasoning),
                "logprobs": logprobs,
                "finish_reason": shapes.finish_reason(choice.finished["finish_reason"]),
            }
            if self.request.parses_tool_calls:
                text, calls = tool_calls.parse(content, self._tool_names())
                if calls:
                    body["message"].update(content=text, tool_calls=calls)
                    if body["finish_reason"] == "stop":  # cut by max_tokens: still "length"
                        body["finish_reason"] = "tool_calls"
            choices.append(self._choice_timings(choice, body))
        body = shapes.envelope("chat.completion", self.id, self.created, self.request.model)
        return self._with_extras({**body, "choices": choices, "usage": self._usage()})

    def _text_completion(self) -> dict[str, Any]:
        k, is_score_only = self.request.num_logprobs, self.request.is_score_only
        choices = []
        for choice in self.choices:
            prefix = choice.prompt_text if self.request.echo else ""
            steps = [] if is_score_only else choice.answer.steps
            logprobs = None
            if k is not None:
                logprobs = shapes.completion_logprobs(steps, k, len(prefix), self.request.raw_logprobs)
                if choice.prompt_tokens is not None:
                    logprobs = shapes.join_logprobs(shapes.prompt_completion_logprobs(choice.prompt_tokens), logprobs)
            body = {
                "index": choice.index,
                "text": prefix + ("" if is_score_only else choice.answer.final_parts()[1]),
                "logprobs": logprobs,
                "finish_reason": "length" if is_score_only else shapes.finish_reason(choice.finished["finish_reason"]),
            }
            choices.append(self._choice_timings(choice, body))
        body = shapes.envelope("text_completion", self.id, self.created, self.request.model)
        return self._with_extras({**body, "choices": choices, "usage": self._usage()})

    # ---- streaming ------------------------------------------------------------------------

    async def stream(self) -> AsyncIterator[bytes]:
        """The server-sent events; the generations are cancelled if the client leaves before their end."""
        try:
            async for data in self._stream():
                yield data
        finally:
            await self.close()

    async def _stream(self) -> AsyncIterator[bytes]:
        for choice in self.choices:
            if self.is_chat:
                yield sse(self._chunk(choice, shapes.chunk_delta("", None, role=True), None))
            elif self.request.echo:
                yield sse(self._chunk(choice, choice.prompt_text, None))
        held: dict[int, tuple[Delta, float]] = {}  # per choice: its latest content chunk and when it was made
        started: set[int] = set()  # choices whose first content chunk went out (never held: time to first token)
        remaining = {choice.index for choice in self.choices}  # those whose last chunk has not gone out
        getting: asyncio.Future[Item] | None = None
        try:
            while remaining:
                if self._early:
                    item = self._early.pop(0)
                else:
                    getting = getting or asyncio.ensure_future(self.inbox.get())
                    done, _ = await asyncio.wait({getting}, timeout=HOLD_CHUNK_S / 2)
                    item, getting = (getting.result(), None) if done else (None, getting)
                for index, (delta, made_at) in list(held.items()):  # chunks held long enough go out
                    if time.monotonic() - made_at >= HOLD_CHUNK_S and (item is None or item.choice.index != index):
                        yield sse(self._delta_chunk(self.choices[index], delta, None))
                        del held[index]
                if item is None:
                    continue
                if item.kind == "error":  # after the headers, an error event ends the stream
                    yield item.choice.error.sse()
                    yield DONE
                    return
                if item.kind == "tokens":
                    item.delta = self._tool_filter(item.choice, item.delta)
                    if item.choice.index in held:
                        yield sse(self._delta_chunk(item.choice, held.pop(item.choice.index)[0], None))
                    if item.delta.is_empty():
                        continue
                    if item.choice.index not in started:
                        started.add(item.choice.index)
                        yield sse(self._delta_chunk(item.choice, item.delta, None))
                    else:
                        held[item.choice.index] = (item.delta, time.monotonic())
                elif item.kind == "end":
                    last = self._tool_filter(item.choice, item.delta)
                    for chunk in self._last_chunks(item.choice, last, held.pop(item.choice.index, None)):
                        yield sse(chunk)
                    remaining.discard(item.choice.index)
        finally:
            if getting is not None:
                getting.cancel()
        if self.request.include_usage or self.request.timings:
            body = {**self._envelope(), "choices": []}
            body["usage"] = self._usage() if self.request.include_usage else None
            yield sse(self._with_extras(body))
        yield DONE

    def _tool_names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.request.tools]

    def _tool_filter(self, choice: Choice, delta: Delta) -> Delta:
        """With tools to parse, a choice's content is held while it may still be a tool call (Qwen
        writes its calls first: `<tool_call>`); once it cannot be, the held text goes out."""
        if not self.request.parses_tool_calls or choice.index in self._free_text:
            return delta
        held = self._held_calls.setdefault(choice.index, Delta())
        held.content += delta.content
        held.content_steps += delta.content_steps
        out = Delta(delta.reasoning, "", delta.reasoning_steps, [], delta.text_offset)
        if tool_calls.may_become_a_call(held.content):
            return out
        self._free_text.add(choice.index)
        del self._held_calls[choice.index]
        out.content, out.content_steps = held.content, held.content_steps
        return out

    def _last_chunks(self, choice: Choice, last: Delta, held: tuple[Delta, float] | None) -> list[dict[str, Any]]:
        """The choice's last chunks: its tool calls as OpenAI streams them (each call's id and name,
        then its arguments, then `finish_reason: "tool_calls"`), or its last content chunk."""
        held_call = self._held_calls.pop(choice.index, None)
        if held_call is None:
            return [self._last_chunk(choice, last, held)]
        _, calls = tool_calls.parse(choice.answer.final_parts()[1], self._tool_names())
        if not calls:  # it was text after all
            last.content, last.content_steps = held_call.content + last.content, held_call.content_steps
            return [self._last_chunk(choice, last, held)]
        chunks = [self._delta_chunk(choice, held[0], None)] if held is not None else []
        if last.reasoning:
            chunks.append(self._delta_chunk(choice, last, None))
        for i, call in enumerate(calls):
            function = call["function"]
            opening = {"index": i, "id": call["id"], "type": "function", "function": {"name": function["name"]}}
            opening["function"]["arguments"] = ""
            chunks.append(self._chunk(choice, {"tool_calls": [opening]}, None))
            arguments = {"index": i, "function": {"arguments": function["arguments"]}}
            chunks.append(self._chunk(choice, {"tool_calls": [arguments]}, None))
        reason = shapes.finish_reason(choice.finished["finish_reason"])
        final = self._chunk(choice, {}, "tool_calls" if reason == "stop" else reason)
        self._choice_timings(choice, final["choices"][0])
        return [*chunks, final]

    def _last_chunk(self, choice: Choice, last: Delta, held: tuple[Delta, float] | None) -> dict[str, Any]:
        """The rest of the text joins the held chunk, which carries the finish reason."""
        if held is not None:
            held[0].reasoning += last.reasoning
            held[0].content += last.content
            last = held[0]
        chunk = self._delta_chunk(choice, last, shapes.finish_reason(choice.finished["finish_reason"]))
        self._choice_timings(choice, chunk["choices"][0])
        return chunk

    def _delta_chunk(self, choice: Choice, delta: Delta, finish_reason: str | None) -> dict[str, Any]:
        k = self.request.num_logprobs
        if self.is_chat:
            logprobs = (
                None
                if k is None
                else shapes.chat_logprobs(delta.content_steps, delta.reasoning_steps, k, self.request.raw_logprobs)
            )
            return self._chunk(choice, shapes.chunk_delta(delta.content, delta.reasoning), finish_reason, logprobs)
        offset = (len(choice.prompt_text) if self.request.echo else 0) + delta.text_offset
        logprobs = None
        if k is not None:
            logprobs = shapes.completion_logprobs(delta.content_steps, k, offset, self.request.raw_logprobs)
        return self._chunk(choice, delta.content, finish_reason, logprobs)

    def _envelope(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.is_chat else "text_completion"
        return shapes.envelope(kind, self.id, self.created, self.request.model)

    def _chunk(self, choice: Choice, delta: Any, finish_reason: str | None, logprobs: Any = None) -> dict[str, Any]:
        body: dict[str, Any] = {"index": choice.index}
        if self.is_chat:
            body["delta"] = delta
        else:
            body["text"] = delta or ""
        body.update(logprobs=logprobs, finish_reason=finish_reason)
        return {**self._envelope(), "choices": [body]}
