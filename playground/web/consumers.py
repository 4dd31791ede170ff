"""The generation WebSocket (`/ws/generate/`): a thin adapter between the browser and the
channel-layer groups the workers publish to.

Owns: command parsing and refusal, following the generations this socket started (group
membership, the worker watchdog) and delivering exactly one terminal event for each.
The record keeping lives in `submit`, the wire shapes in `protocol`. Must not import torch
or the engine.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from inference.text.reasoning import prompt_opens_reasoning, segments_for_browser
from playground import dispatch, protocol
from playground.coord import liveness, model_states
from playground.models import Generation
from playground.protocol import CommandError, get_field
from playground.web import frames, submit

logger = logging.getLogger(__name__)

WATCH_INTERVAL_S = 1.0
# The watchdog reports an ended generation from the DB only after seeing it ended this many
# times in a row: the worker's own terminal event may still be on its way.
NUM_ENDED_CHECKS = 2


class GenerationConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        # A client that never loaded a page has no session: it gets one with its first
        # generating command, not here (a socket that does nothing creates no row).
        self.session_key: str | None = self.scope["session"].session_key
        self.watchdogs: dict[int, asyncio.Task[None]] = {}  # the generations this socket follows
        self.is_following_models = False
        await self.accept()

    async def disconnect(self, code: int) -> None:
        # The generations go on (their answers are saved); this socket just stops following.
        if self.is_following_models:
            await self.channel_layer.group_discard(protocol.MODELS_GROUP, self.channel_name)
        for generation_id in list(self.watchdogs):
            await self._unfollow(generation_id)

    # ---- commands ------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        try:
            content = frames.parse(text_data, bytes_data)
        except frames.FrameError as exc:
            await self.send_json(protocol.error(exc.code, exc.message, exc.request_id))
            return
        await self.receive_json(content)

    async def receive_json(self, content: dict[str, Any], **kwargs: Any) -> None:
        request_id = content.get("request_id") if isinstance(content.get("request_id"), str) else None
        try:
            get_field(content, "request_id", str)
            command = content.get("command")
            if command == "stop":
                await self._stop(content)
            elif command == "attach":
                await self._attach(content, request_id)
            elif command == "follow_models":
                await self._follow_models()
            elif isinstance(command, str) and command in submit.COMMANDS:
                await self._start(command, content, request_id)
            else:
                names = ", ".join([*submit.COMMANDS, "stop", "attach", "follow_models"])
                raise CommandError("unknown_command", f"unknown command {command!r}; expected one of {names}")
        except CommandError as exc:
            await self.send_json(protocol.error(exc.code, exc.message, request_id))
        except Exception:
            logger.exception("command %r failed", content.get("command"))
            await self.send_json(protocol.error("internal_error", "the server failed to run this command", request_id))

    async def _start(self, command: str, content: dict[str, Any], request_id: str | None) -> None:
        pd_requested = dispatch.pd_requested(content)  # checked before anything is written
        await database_sync_to_async(dispatch.check_servable)(pd_requested)
        if self.session_key is None:
            session = self.scope["session"]
            await database_sync_to_async(session.save)()
            self.session_key = session.session_key
        queued = await database_sync_to_async(submit.submit)(command, self.session_key, content)
        generation_id = queued.generation_id
        # Join the group before the task exists, so no event of the worker can be missed; they
        # wait in this consumer's queue until `generation.queued` has gone out.
        await self._follow(generation_id)
        try:
            await database_sync_to_async(dispatch.enqueue)(generation_id, pd_requested, queued.conversation_id)
            ended = None
        except Exception as exc:
            logger.exception("generation %s could not be queued", generation_id)
            ended = await database_sync_to_async(submit.fail)(
                generation_id, "internal_error", f"the task queue is unreachable: {exc}"
            )
        await self.send_json(
            protocol.generation_queued(
                request_id, generation_id, queued.conversation_id, queued.user_message_id, queued.message_id
            )
        )
        if ended is not None:
            await self._deliver(await database_sync_to_async(ended.terminal_event)())

    async def _stop(self, content: dict[str, Any]) -> None:
        ended = await database_sync_to_async(submit.stop)(self.session_key, content)
        generation_id = content["generation_id"]  # submit.stop checked it
        if generation_id not in self.watchdogs and (ended is not None or await _is_active(generation_id)):
            # Started by another socket of this session (e.g. before a reload): follow it, so
            # its one terminal event reaches the socket that stopped it.
            await self._follow(generation_id)
        if ended is not None:  # it was still queued: no worker will report it
            await self._deliver(await database_sync_to_async(ended.terminal_event)())

    async def _attach(self, content: dict[str, Any], request_id: str | None) -> None:
        """Follows a generation this session started on another socket (a reload): what was
        saved so far, then its live events, then its one terminal event."""
        generation = await database_sync_to_async(submit.attach)(self.session_key, content)
        if generation.is_active and generation.pk not in self.watchdogs:
            await self._follow(generation.pk)  # before the snapshot: nothing between is missed
            generation = await database_sync_to_async(submit.attach)(self.session_key, content)
        await self.send_json(await database_sync_to_async(_attached_event)(generation, request_id))
        if not generation.is_active:
            if generation.pk not in self.watchdogs:
                await self._follow(generation.pk)
            await self._deliver(await database_sync_to_async(generation.terminal_event)())

    async def _follow_models(self) -> None:
        """Every worker's model ("loading" and for how long, "ready", "error"): now, then each change."""
        if not self.is_following_models:
            await self.channel_layer.group_add(protocol.MODELS_GROUP, self.channel_name)
            self.is_following_models = True
        try:
            for event in await database_sync_to_async(model_states.current)():
                await self.send_json(event)
        except redis.RedisError as exc:
            logger.warning("could not read the workers' model states: %s", exc)

    # ---- events from the workers ---------------------------------------------------------

    async def _deliver(self, event: dict[str, Any]) -> None:
        """Forwards an event of a followed generation; after its terminal event, nothing more."""
        generation_id = event["generation_id"]
        if generation_id not in self.watchdogs:
            return  # already ended here (e.g. the watchdog reported it): drop the duplicate
        if protocol.is_terminal(event):
            await self._unfollow(generation_id)
        await self.send_json(event)

    # Channel-layer handlers: `generation.tokens` -> `generation_tokens`, and so on.
    generation_started = generation_prefilled = generation_tokens = generation_beams = _deliver
    generation_handoff = generation_finished = generation_error = generation_waiting = _deliver

    async def worker_model(self, event: dict[str, Any]) -> None:
        await self.send_json(event)

    async def _follow(self, generation_id: int) -> None:
        await self.channel_layer.group_add(protocol.group_name(generation_id), self.channel_name)
        self.watchdogs[generation_id] = asyncio.create_task(self._watch(generation_id))

    async def _unfollow(self, generation_id: int) -> None:
        watchdog = self.watchdogs.pop(generation_id)
        if watchdog is not asyncio.current_task():
            watchdog.cancel()
        await self.channel_layer.group_discard(protocol.group_name(generation_id), self.channel_name)

    async def _watch(self, generation_id: int) -> None:
        """Reports a generation whose worker died (or whose terminal event got lost)."""
        num_ended_checks = 0
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            try:
                await database_sync_to_async(dispatch.reroute_if_stranded)(generation_id)
                event = await database_sync_to_async(liveness.ended_event)(generation_id)
            except Exception:
                logger.exception("watchdog of generation %s failed; retrying", generation_id)
                continue
            num_ended_checks = num_ended_checks + 1 if event else 0
            if num_ended_checks >= NUM_ENDED_CHECKS:
                await self._deliver(event)
                return


@database_sync_to_async
def _is_active(generation_id: int) -> bool:
    return Generation.objects.filter(pk=generation_id, status__in=Generation.ACTIVE_STATUSES).exists()


def _attached_event(generation: Generation, request_id: str | None) -> dict[str, Any]:
    starts_in_reasoning = prompt_opens_reasoning(generation.prompt_text)
    return protocol.generation_attached(
        request_id,
        generation.pk,
        generation.status,
        generation.text,
        list(generation.steps),
        segments_for_browser(generation.text, starts_in_reasoning=starts_in_reasoning),
    )
