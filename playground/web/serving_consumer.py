"""The serving view's WebSocket (`/ws/serving/`): every worker's continuous-batching steps, live.

Owns: saying which workers are alive when the page connects (`serving.workers`: an idle worker
runs no steps, so the page would not know it is there), joining the `serving` group (again after
a Redis outage: `layer_outage`) and forwarding its `serving.step` messages (the workers publish
them, throttled, from
`playground.worker.serving_view`). Read-only: the socket takes no commands, so any message gets
a stable error and changes nothing. Must not import torch.
"""

from __future__ import annotations

import contextlib
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from playground import protocol
from playground.coord import liveness
from playground.coord.store import OUTAGE_ERRORS
from playground.web.layer_outage import SurvivesLayerOutage


class ServingConsumer(SurvivesLayerOutage, AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        await self.accept()
        await self.layer_back({})
        with contextlib.suppress(*OUTAGE_ERRORS):  # Redis down: the page learns of the workers from their steps
            await self.send_json(protocol.serving_workers(await database_sync_to_async(liveness.alive_workers)()))

    async def disconnect(self, code: int) -> None:
        with contextlib.suppress(*OUTAGE_ERRORS):
            await self.channel_layer.group_discard(protocol.SERVING_GROUP, self.channel_name)

    async def layer_lost(self, message: dict[str, Any]) -> None:
        pass  # the page shows no step until the workers publish again

    async def layer_back(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(*OUTAGE_ERRORS):  # not yet: the receive fails, and layer.back comes again
            await self.channel_layer.group_add(protocol.SERVING_GROUP, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        await self.send_json(protocol.error("unknown_command", "the serving view only listens; it takes no commands"))

    async def serving_step(self, event: dict[str, Any]) -> None:
        await self.send_json(event)
