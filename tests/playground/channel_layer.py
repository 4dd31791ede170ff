"""The tests' channel layer: channels' in-memory one, made safe for a send from another thread.

The worker's sends come from its own sending loop, on its own thread (`worker.publisher`), while
the consumer under test waits on the test's loop. The in-memory layer's `asyncio.Queue` wakes
its getter with a plain `call_soon` on the getter's loop: from another thread that call does
not wake a loop asleep in `select()`, so the message sat unseen until the receive timed out
whenever the send landed after the test's loop had gone back to sleep (a CI failure on a busy
machine). Redis, the layer users run, has no such gap: this hands such a send to the
receiver's loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer


class ThreadSafeInMemoryChannelLayer(InMemoryChannelLayer):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loop_of_channel: dict[str, asyncio.AbstractEventLoop] = {}

    async def receive(self, channel: str) -> dict[str, Any]:
        self.loop_of_channel[channel] = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        loop = self.loop_of_channel.get(channel)
        if loop is None or loop is asyncio.get_running_loop() or loop.is_closed():
            return await super().send(channel, message)
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(super().send(channel, message), loop))
