"""The channel layer: channels_redis' `RedisChannelLayer`, with its round trips batched.

channels_redis pays four Redis round trips for each group message it sends (expire the group's
old members, read them, expire each channel's old messages, add the message) and four for each
message it receives (restore the backup queue, pop, back up, clean the backup). With 16 streams
a worker sends ~60 messages a second, and each round trip costs both processes and Redis a
system call and a wakeup on the cores the forward pass needs. Here:

- `group_send_many` sends several groups' messages in two round trips (their members for all,
  then every message). The worker's publisher sends what its streams hand it meanwhile as one
  batch, and its streams flush at the same instants (publisher.StepCoalescer).
- A process's receive takes every message waiting for its process-local channels in one round
  trip (`MAX_POPPED`), and blocks (channels_redis' own path) only when none waits. A worker
  sends its streams' messages together, so they arrive together.

Semantics are channels_redis': group expiry, per-channel capacity (a full channel drops the
message), message expiry, `__asgi_channel__` fan-out. Must not know: what the messages mean.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Sequence
from typing import Any

from channels_redis.core import RedisChannelLayer as ChannelsRedisLayer

logger = logging.getLogger(__name__)

MAX_POPPED = 64  # messages one non-blocking receive takes at most

# channels_redis' group send script: adds each message to its channel unless the channel is full.
_SEND_LUA = """
local over_capacity = 0
local current_time = ARGV[#ARGV - 1]
local expiry = ARGV[#ARGV]
for i = 1, #KEYS do
    if redis.call('ZCOUNT', KEYS[i], '-inf', '+inf') < tonumber(ARGV[i + #KEYS]) then
        redis.call('ZADD', KEYS[i], current_time, ARGV[i])
        redis.call('EXPIRE', KEYS[i], expiry)
    else
        over_capacity = over_capacity + 1
    end
end
return over_capacity
"""

# The oldest messages of a channel, at most ARGV[1] of them, taken without blocking.
_POP_LUA = "return redis.call('ZPOPMIN', KEYS[1], ARGV[1])"


class RedisChannelLayer(ChannelsRedisLayer):
    """channels_redis' layer on one Redis (`hosts` of one: the playground's REDIS_URL); with
    several hosts it falls back to channels_redis' own calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._popped: dict[str, collections.deque[bytes]] = collections.defaultdict(collections.deque)

    # ---- sending ---------------------------------------------------------------------

    async def group_send_many(self, sends: Sequence[tuple[str, dict[str, Any]]]) -> None:
        """Sends each (group, message), in order."""
        if not sends:
            return
        if self.ring_size != 1:
            for group, message in sends:
                await self.group_send(group, message)
            return
        connection = self.connection(0)
        lookup = connection.pipeline(transaction=False)
        for group, _ in sends:
            key = self._group_key(group)
            lookup.zremrangebyscore(key, min=0, max=int(time.time()) - self.group_expiry)
            lookup.zrange(key, 0, -1)
        members = (await lookup.execute())[1::2]
        pipe = connection.pipeline(transaction=False)
        adds = []  # the position of each message's script in the pipeline
        for (group, message), channels in zip(sends, members):
            if channels:
                adds.append((group, self._add_group_message(pipe, [c.decode("utf8") for c in channels], message)))
        if not adds:
            return
        replies = await pipe.execute()
        for group, position in adds:
            if replies[position]:
                logger.info(
                    "%s channel(s) over capacity in group %s: the message was dropped", replies[position], group
                )

    def _add_group_message(self, pipe: Any, channel_names: list[str], message: dict[str, Any]) -> int:
        """Queues the message for every channel of the group; its script's position in `pipe`."""
        _, key_to_message, key_to_capacity = self._map_channel_keys_to_connection(channel_names, message)
        channel_keys = list(key_to_message)
        for key in channel_keys:  # as channels_redis: a channel's expired messages go first
            pipe.zremrangebyscore(key, min=0, max=int(time.time()) - int(self.expiry))
        args = [key_to_message[key] for key in channel_keys] + [key_to_capacity[key] for key in channel_keys]
        pipe.eval(_SEND_LUA, len(channel_keys), *channel_keys, *args, time.time(), self.expiry)
        return len(pipe) - 1

    # ---- receiving -------------------------------------------------------------------

    async def receive_single(self, channel: str) -> tuple[Any, dict[str, Any]]:
        """One message of `channel` (the process-local one: `specific.<process>!`): from what
        the last pop took, else up to MAX_POPPED in one round trip, else channels_redis'
        blocking receive."""
        if self.ring_size != 1 or "!" not in channel:
            return await super().receive_single(channel)
        popped = self._popped[channel]
        if not popped:
            await self._pop_waiting(channel, popped)
        if not popped:
            return await super().receive_single(channel)
        message = self.deserialize(popped.popleft())
        if "__asgi_channel__" in message:
            channel = message.pop("__asgi_channel__")
        return channel, message

    async def _pop_waiting(self, channel: str, popped: collections.deque[bytes]) -> None:
        """Takes what waits on `channel` into `popped`. Shielded: a receiver cancelled meanwhile
        (its socket closed) leaves the messages, which may be other sockets', to the next one."""
        pop = asyncio.ensure_future(self.connection(0).eval(_POP_LUA, 1, self.prefix + channel, MAX_POPPED))
        try:
            taken = await asyncio.shield(pop)
        except asyncio.CancelledError:
            pop.add_done_callback(lambda done: _keep_taken(done, popped))
            raise
        popped.extend(taken[::2])  # ZPOPMIN's reply: member, score, member, score, ...


def _keep_taken(pop: asyncio.Future, popped: collections.deque[bytes]) -> None:
    if not pop.cancelled() and pop.exception() is None:
        popped.extend(pop.result()[::2])
