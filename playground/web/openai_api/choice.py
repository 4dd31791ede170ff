"""One choice of an API request as its generation's events arrive.

A request may hold several choices (`n`, a list of prompts); each is its own generation,
followed over the channel layer by its own `Follower`. Each choice's events are read as soon as
they come, by a task of its own (so none waits in the channel layer while the request waits for
another unit's turn, or for another choice), and handed to the run as `Item`s in one inbox.

Owns: the pump, the choice's answer (`Answer`), its started and finished records, its queue time
(from the request's arrival to its worker's start; never None once any event came). Must not
know: OpenAI's shapes, HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from playground import protocol
from playground.web.openai_api.answer import Answer, Delta
from playground.web.openai_api.errors import ApiError, from_event
from playground.web.openai_api.follow import Follower

logger = logging.getLogger(__name__)


@dataclass
class Item:
    """What one event did to a choice: "started", "tokens" (with the text `delta`), "end" (with
    the rest of the text) or "error"."""

    choice: Choice
    kind: str
    delta: Delta | None = None


class Choice:
    def __init__(
        self, index: int, generation_id: int, *, is_chat: bool, arrived_at: float, on_end: Callable[[], None]
    ) -> None:
        self.index, self.is_chat, self.arrived_at, self.on_end = index, is_chat, arrived_at, on_end
        self.follower = Follower(generation_id)
        self.answer = Answer(split_reasoning=is_chat)
        self.worker_start_ms: float | None = None  # request arrival -> its worker started it
        self.prompt_text = ""
        self.is_started = False
        self.finished: dict[str, Any] | None = None
        self.error: ApiError | None = None
        self.prompt_tokens: list[dict[str, Any]] | None = None  # echo + logprobs: the prompt's own
        self._pump: asyncio.Future[None] | None = None

    @property
    def generation_id(self) -> int:
        return self.follower.generation_id

    @property
    def has_ended(self) -> bool:
        return self.finished is not None or self.error is not None

    @property
    def stats(self) -> dict[str, Any]:
        return (self.finished or {}).get("stats") or {}

    @property
    def queue_ms(self) -> float:
        """Request arrival -> its prefill began: waiting for the client's turn and a worker
        (measured here), then for room in the worker's batch (the worker's `queue_ms`)."""
        worker_start_ms = self.worker_start_ms if self.worker_start_ms is not None else self._since_arrival_ms()
        return worker_start_ms + (self.stats.get("queue_ms") or 0.0)

    async def join(self, inbox: asyncio.Queue[Item]) -> None:
        """Joins the generation's group (before it is queued: no event is missed) and starts reading."""
        await self.follower.join()
        # A context of its own: the view's (its sync thread, for thread-sensitive calls) ends
        # when the view returns, before the stream that this task feeds does.
        self._pump = asyncio.get_running_loop().create_task(self._read(inbox), context=contextvars.Context())

    async def close(self) -> None:
        """Stops reading; the generation is cancelled unless it ended (its client left)."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
        await self.follower.close()

    async def _read(self, inbox: asyncio.Queue[Item]) -> None:
        try:
            async for event in self.follower.events():
                item = self._on_event(event)
                if item is not None:
                    inbox.put_nowait(item)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the follower itself failed: the choice ends with an error
            logger.exception("generation %s: following it failed", self.generation_id)
            message = protocol.without_server_paths(f"following the generation failed: {exc}")
            self.error = ApiError(message, code="internal_error", status=500)
            inbox.put_nowait(Item(self, "error"))
        finally:
            if self.has_ended:
                self.on_end()

    def _on_event(self, event: dict[str, Any] | None) -> Item | None:
        kind = event and event.get("type")
        if self.worker_start_ms is None and kind in (
            "generation.started",
            "generation.tokens",
            "generation.finished",
            "generation.error",
        ):  # the first of its events; always `started` unless the channel layer lost it
            self.worker_start_ms = self._since_arrival_ms()
        if kind == "generation.started":
            self.is_started = True
            self.prompt_text = event["prompt"]["text"]
            self.answer.starts_in_reasoning = self.is_chat and event["prompt"].get("opens_reasoning", False)
            return Item(self, "started")
        if kind == "generation.tokens":
            return Item(self, "tokens", self.answer.add(protocol.steps_of(event)))
        if kind == "generation.finished":
            self.finished = event
            return Item(self, "end", self.answer.finish(event["text"]))
        if kind == "generation.error":
            self.error = from_event(event)
            return Item(self, "error")
        return None

    def _since_arrival_ms(self) -> float:
        return (time.monotonic() - self.arrived_at) * 1000
