"""WebSocket consumers that outlive their channel layer's Redis.

Owns: turning a failing `channel_layer.receive` (Redis killed, restarting, unreachable) into one
`layer.lost` message for the consumer's handler instead of an exception that closes every
socket with 1011, probing the layer with a backoff until it answers, and one `layer.back`
message then (a restarted Redis has forgotten the groups: the consumer joins its own again).
Must not know: what the consumer does with either.

Channels' `AsyncConsumer.__call__` sets `self.channel_receive` and hands it to its dispatch loop;
the property below takes that assignment and gives the loop `_receive_surviving_outage` instead,
so nothing of Channels is copied here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from playground.coord.store import OUTAGE_ERRORS

logger = logging.getLogger(__name__)

FIRST_RETRY_S = 0.25
MAX_RETRY_S = 2.0
_PROBE_GROUP = "playground-layer-probe"  # discarding from it writes nothing: a cheap round trip


class SurvivesLayerOutage:
    """Mix into an `AsyncConsumer` (before it) and define `layer_lost` / `layer_back` handlers."""

    is_layer_down = False
    _layer_receive: Callable[[], Awaitable[dict[str, Any]]]

    @property
    def channel_receive(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        return self._receive_surviving_outage

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self._layer_receive = receive

    async def _receive_surviving_outage(self) -> dict[str, Any]:
        if self.is_layer_down:
            await self._wait_for_layer()
            self.is_layer_down = False
            logger.info("channel layer answers again")
            return {"type": "layer.back"}
        try:
            return await self._layer_receive()
        except OUTAGE_ERRORS as exc:
            logger.warning("channel layer lost: %s", exc)
            self.is_layer_down = True
            return {"type": "layer.lost"}

    async def _wait_for_layer(self) -> None:
        delay_s = FIRST_RETRY_S
        while True:
            await asyncio.sleep(delay_s)
            try:
                await self.channel_layer.group_discard(_PROBE_GROUP, self.channel_name)  # type: ignore[attr-defined]
                return
            except OUTAGE_ERRORS:
                delay_s = min(delay_s * 2, MAX_RETRY_S)
