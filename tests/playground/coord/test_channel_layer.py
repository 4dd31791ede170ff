"""The channel layer's batched round trips (playground/coord/layer.py), on a real Redis: what
channels_redis delivers, delivered the same, in fewer round trips.

Each test's coroutine runs on an event loop of its own thread (`on_own_loop`): the browser tests'
Playwright keeps a loop running on the main thread of the pytest worker they share."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
from collections.abc import Awaitable, Callable

import pytest
import redis

from playground.coord.layer import MAX_POPPED, RedisChannelLayer


def on_own_loop(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(test)  # pytest reads the fixtures it asks for from its signature
    def run(*args: object, **kwargs: object) -> None:
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, test(*args, **kwargs)).result(timeout=60)

    return run


@pytest.fixture
def layer(redis_url: str) -> RedisChannelLayer:  # an empty database: the app_settings fixture flushed it
    return RedisChannelLayer(hosts=[redis_url], prefix="test-layer")


@on_own_loop
async def test_each_group_gets_its_message_and_a_group_nobody_follows_is_skipped(layer: RedisChannelLayer) -> None:
    channels = [await layer.new_channel() for _ in range(3)]
    for index, channel in enumerate(channels):
        await layer.group_add(f"g{index}", channel)
    sends = [("nobody", {"type": "x"})] + [(f"g{i}", {"type": "x", "i": i}) for i in range(3)]
    await layer.group_send_many(sends)
    for index, channel in enumerate(channels):
        assert await layer.receive(channel) == {"type": "x", "i": index}
    await layer.group_send_many([("nobody", {"type": "x"})])  # nothing to send: no second round trip
    await layer.flush()


@on_own_loop
async def test_a_groups_messages_keep_their_order_and_a_full_channel_drops_as_channels_redis_does(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    layer = RedisChannelLayer(hosts=[redis_url], prefix="test-layer", capacity=3)  # per Redis key: the process's
    channel = await layer.new_channel()
    await layer.group_add("g", channel)
    with caplog.at_level(logging.INFO, logger="playground.coord.layer"):
        await layer.group_send_many([("g", {"type": "x", "i": i}) for i in range(5)])
    assert [r.getMessage() for r in caplog.records].count(
        "1 channel(s) over capacity in group g: the message was dropped"
    ) == 2
    assert [(await layer.receive(channel))["i"] for _ in range(3)] == [0, 1, 2]
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(channel), 0.3)
    await layer.flush()


@on_own_loop
async def test_one_round_trip_takes_every_message_waiting_for_the_process(
    layer: RedisChannelLayer, redis_url: str
) -> None:
    """Several sockets of one process: the first receive takes all their waiting messages at
    once (the channel's Redis key is empty after it), and each socket gets its own, in order."""
    channels = [await layer.new_channel() for _ in range(4)]
    for index, channel in enumerate(channels):
        await layer.group_add(f"g{index}", channel)
    await layer.group_send_many([(f"g{i % 4}", {"type": "x", "i": i}) for i in range(8)])
    process_key = layer.prefix + layer.non_local_name(channels[0])
    client = redis.Redis.from_url(redis_url)
    assert client.zcard(process_key) == 8
    assert (await layer.receive(channels[0]))["i"] == 0
    assert client.zcard(process_key) == 0  # the other seven are in this process now
    assert (await layer.receive(channels[0]))["i"] == 4
    assert {index: [(await layer.receive(channels[index]))["i"] for _ in range(2)] for index in (1, 2, 3)} == {
        1: [1, 5],
        2: [2, 6],
        3: [3, 7],
    }
    assert MAX_POPPED >= 8
    await layer.flush()


@on_own_loop
async def test_a_receive_cancelled_while_it_takes_the_waiting_messages_loses_none(layer: RedisChannelLayer) -> None:
    """The take is one atomic pop: a socket that closes meanwhile (its receive cancelled) must
    leave the messages it took, which may be other sockets', to the next receive."""
    channels = [await layer.new_channel() for _ in range(2)]
    for index, channel in enumerate(channels):
        await layer.group_add(f"g{index}", channel)
    await layer.group_send_many([(f"g{i}", {"type": "x", "i": i}) for i in range(2)])
    entered, go_on = asyncio.Event(), asyncio.Event()
    connection = layer.connection(0)
    real_eval = connection.eval

    async def gated_eval(*args):  # the pop is on its way while this waits
        entered.set()
        await go_on.wait()
        return await real_eval(*args)

    connection.eval = gated_eval
    closing = asyncio.ensure_future(layer.receive(channels[0]))
    await entered.wait()
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    connection.eval = real_eval
    go_on.set()
    assert (await asyncio.wait_for(layer.receive(channels[1]), 5))["i"] == 1
    assert (await asyncio.wait_for(layer.receive(channels[0]), 5))["i"] == 0
    await layer.flush()
