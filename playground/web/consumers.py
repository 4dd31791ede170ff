"""The generation WebSocket (`/ws/generate/`): a thin adapter between the browser and the
channel-layer groups the workers publish to.

Owns: command parsing and refusal, whose records the socket may touch (the owner of its
browser session, checked against its page's token: `owners`), following the generations this
socket started (group membership, the worker watchdog) and delivering exactly one terminal
event for each, Redis outages included (`layer_outage`: the socket stays open, a queued
generation ends as `service_unavailable` at once, a running one when its worker, which cannot
publish either, has saved it so).
The record keeping lives in `submit`, the wire shapes in `protocol`, the watchdog's decision
(re-route, report from the database) in `following`. Must not import torch or the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import redis
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.utils import translation
from django.utils.translation import gettext

from inference.text.reasoning import segments_for_browser
from playground import dispatch, protocol
from playground.coord import model_states, recent_steps
from playground.coord.store import OUTAGE_ERRORS, OUTAGE_MESSAGE
from playground.models import Generation
from playground.protocol import CommandError, get_field
from playground.web import following, frames, language, owners, submit
from playground.web.layer_outage import SurvivesLayerOutage

logger = logging.getLogger(__name__)

SESSION_CHANGED_CLOSE_CODE = 4409


class GenerationConsumer(SurvivesLayerOutage, AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        # The owner of the page's browser session. A client without one (a script that loaded no
        # page) gets an owner of its own with its first generating command, held by this socket
        # only: no session row, and nobody else can read its records.
        self.owner: str | None = await database_sync_to_async(owners.browser_owner)(self.scope["session"])
        # The generations this socket follows: each one's watchdog and the task running it.
        self.watchdogs: dict[int, tuple[following.Watchdog, asyncio.Task[None]]] = {}
        self.is_refused = False
        self.is_following_models = False
        # Refusals are worded in the page's language (the session's choice, else the browser's).
        self.language = await database_sync_to_async(language.scope_language)(self.scope)
        await self.accept()
        try:
            with translation.override(self.language):
                owners.check_page_token(self.owner, owners.scope_page_token(self.scope))
        except CommandError as exc:  # the cookie changed under the page: it reloads on this code
            self.owner, self.is_refused = None, True  # nothing it sends until the close is read
            await self.send_json(protocol.error(exc.code, exc.message, None))
            await self.close(code=SESSION_CHANGED_CLOSE_CODE)

    async def disconnect(self, code: int) -> None:
        # The generations go on (their answers are saved); this socket just stops following.
        if self.is_following_models:
            with contextlib.suppress(*OUTAGE_ERRORS):
                await self.channel_layer.group_discard(protocol.MODELS_GROUP, self.channel_name)
        for generation_id in list(self.watchdogs):
            await self._unfollow(generation_id)

    # ---- commands ------------------------------------------------------------------------

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        if self.is_refused:
            return
        with translation.override(self.language):
            await self._receive(text_data, bytes_data)

    async def _receive(self, text_data: str | None, bytes_data: bytes | None) -> None:
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
        except OUTAGE_ERRORS as exc:  # e.g. a stop flag that cannot be written
            logger.warning("command %r failed: Redis is unreachable: %s", content.get("command"), exc)
            await self.send_json(protocol.error("service_unavailable", OUTAGE_MESSAGE, request_id))
        except Exception:
            logger.exception("command %r failed", content.get("command"))
            await self.send_json(
                protocol.error("internal_error", gettext("the server failed to run this command"), request_id)
            )

    async def _start(self, command: str, content: dict[str, Any], request_id: str | None) -> None:
        pd_requested = dispatch.pd_requested(content)  # checked before anything is written
        if self.is_layer_down:  # nothing could reach a worker, nor come back
            raise CommandError("service_unavailable", OUTAGE_MESSAGE)
        if dispatch.is_disaggregated(pd_requested):  # the only mode with something to check
            await database_sync_to_async(dispatch.check_servable)(pd_requested)
        if self.owner is None:
            self.owner = owners.new_browser_owner()
        queued = await database_sync_to_async(submit.submit)(command, self.owner, content)
        generation_id = queued.generation_id
        # Join the group before the task exists, so no event of the worker can be missed; they
        # wait in this consumer's queue until `generation.queued` has gone out.
        await self._follow(generation_id, join=False)
        try:
            await self._join(generation_id)
            await sync_to_async(dispatch.enqueue, thread_sensitive=False)(
                generation_id, pd_requested, queued.conversation_id
            )
            ended = None
        except OUTAGE_ERRORS as exc:
            logger.warning("generation %s could not be queued: Redis is unreachable: %s", generation_id, exc)
            ended = await database_sync_to_async(submit.fail)(generation_id, "service_unavailable", OUTAGE_MESSAGE)
        except Exception as exc:
            logger.exception("generation %s could not be queued", generation_id)
            ended = await database_sync_to_async(submit.fail)(
                generation_id, "internal_error", f"the task could not be queued: {exc}"
            )
        await self.send_json(
            protocol.generation_queued(
                request_id, generation_id, queued.conversation_id, queued.user_message_id, queued.message_id
            )
        )
        if ended is not None:
            await self._deliver(await database_sync_to_async(ended.terminal_event)())

    async def _stop(self, content: dict[str, Any]) -> None:
        ended = await database_sync_to_async(submit.stop)(self.owner or "", content)
        generation_id = content["generation_id"]  # submit.stop checked it
        if generation_id not in self.watchdogs and (ended is not None or await _is_active(generation_id)):
            # Started by another socket of this owner (e.g. before a reload): follow it, so
            # its one terminal event reaches the socket that stopped it.
            await self._follow(generation_id)
        if ended is not None:  # it was still queued: no worker will report it
            await self._deliver(await database_sync_to_async(ended.terminal_event)())

    async def _attach(self, content: dict[str, Any], request_id: str | None) -> None:
        """Follows a generation this owner started on another socket (a reload): every step
        so far, then its live events, then its one terminal event."""
        generation = await database_sync_to_async(submit.attach)(self.owner, content)
        if generation.is_active and generation.pk not in self.watchdogs:
            await self._follow(generation.pk)  # first: every step published from now on comes live
        # Then the steps published since the row's last save, then the row (the worker saves
        # before it trims that tail): together they reach the live ones (coord/recent_steps.py).
        tail = await database_sync_to_async(recent_steps.read)(generation.pk)
        generation = await database_sync_to_async(submit.attach)(self.owner, content)
        await self.send_json(await database_sync_to_async(_attached_event)(generation, tail, request_id))
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
        else:
            self.watchdogs[generation_id][0].saw_event()
        await self.send_json(event)

    @classmethod
    async def encode_json(cls, content: dict[str, Any]) -> str:
        # Steps with their top-k alternatives are most of what daphne sends: they arrive as the
        # worker's JSON text and go out as it is; the rest orjson encodes (a twentieth of the json
        # module's time, and a stray NaN as null, not NaN).
        return protocol.frame_text(content)

    # Channel-layer handlers: `generation.tokens` -> `generation_tokens`, and so on.
    generation_started = generation_prefilled = generation_tokens = generation_beams = _deliver
    generation_handoff = generation_finished = generation_error = generation_waiting = _deliver

    async def layer_lost(self, message: dict[str, Any]) -> None:
        """Redis is gone (`layer_outage`): no worker's event can reach this socket now. A followed
        generation still queued ends here; a running one is ended by its worker (it cannot
        publish either) and reported by its watchdog from the database."""
        for generation_id in list(self.watchdogs):
            event = await following.outage_event(generation_id)
            if event is not None:
                await self._deliver(event)

    async def layer_back(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(*OUTAGE_ERRORS):  # gone again: the next layer.back joins
            for generation_id in list(self.watchdogs):  # a restarted Redis has forgotten the groups
                await self._join(generation_id)
            if self.is_following_models:
                await self.channel_layer.group_add(protocol.MODELS_GROUP, self.channel_name)

    async def worker_model(self, event: dict[str, Any]) -> None:
        await self.send_json(event)

    async def _follow(self, generation_id: int, *, join: bool = True) -> None:
        """Watches the generation (from the database too) and joins its group."""
        watchdog = following.Watchdog(generation_id)
        self.watchdogs[generation_id] = (watchdog, asyncio.create_task(self._watch(watchdog)))
        if join:
            await self._join(generation_id)

    async def _join(self, generation_id: int) -> None:
        await self.channel_layer.group_add(protocol.group_name(generation_id), self.channel_name)

    async def _unfollow(self, generation_id: int) -> None:
        _, watching = self.watchdogs.pop(generation_id)
        if watching is not asyncio.current_task():
            watching.cancel()
        with contextlib.suppress(*OUTAGE_ERRORS):  # a group Redis forgot (or will) needs no leaving
            await self.channel_layer.group_discard(protocol.group_name(generation_id), self.channel_name)

    async def _watch(self, watchdog: following.Watchdog) -> None:
        """Reports a generation whose worker died (or whose terminal event got lost, e.g. with Redis)."""
        await self._deliver(await watchdog.watch())


@database_sync_to_async
def _is_active(generation_id: int) -> bool:
    return Generation.objects.filter(pk=generation_id, status__in=Generation.ACTIVE_STATUSES).exists()


def _attached_event(generation: Generation, tail: list[dict[str, Any]], request_id: str | None) -> dict[str, Any]:
    text, steps = recent_steps.merged(generation.text, list(generation.steps), tail, is_running=generation.is_active)
    starts_in_reasoning = generation.opens_reasoning
    return protocol.generation_attached(
        request_id,
        generation.pk,
        generation.status,
        text,
        steps,
        segments_for_browser(text, starts_in_reasoning=starts_in_reasoning),
        generation.params,
    )
