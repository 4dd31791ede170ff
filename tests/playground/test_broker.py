"""playground/broker.py: Redis killed while a task runs leaves a broker connection the Celery
consumer can tear down and replace, instead of kombu's AttributeError that made the worker exit.

Each test runs a throw-away redis-server of its own (it is killed) and does, with kombu alone,
what the worker's consumer does: a connection in the state of a worker that runs a task, then
Redis killed, then Celery's teardown after a lost connection. The live version (a real worker
under `make run`'s supervisor) is tests/system/test_redis_loss.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.common import ignore_errors

from scripts.net import free_port
from scripts.processes import Service
from scripts.redis_server import start_redis

KOMBU_TRANSPORT = None  # the one the `redis://` scheme names
PLAYGROUND_TRANSPORT = "playground.broker:Transport"  # settings.CELERY_BROKER_TRANSPORT
# What Celery's consumer gives collect() (celery.worker.consumer.consumer.COLLECT_SOCKET_TIMEOUT).
COLLECT_SOCKET_TIMEOUT_S = 5.0


@pytest.fixture
def doomed_redis(tmp_path: Path) -> Iterator[tuple[Service, str]]:
    service, url = start_redis(tmp_path, free_port())
    try:
        yield service, url
    finally:
        service.kill()


def connection_running_a_task(url: str, transport: str | None) -> Connection:
    """A connection as a worker's is while it runs a task: on the default channel a message
    delivered and not acknowledged (`task_acks_late`) and the next BRPOP in flight; on a second
    channel a fanout queue consumed (the worker's remote control, `pidbox`)."""
    connection = Connection(url, transport=transport)
    channel = connection.default_channel
    tasks = Queue("gpu", routing_key="gpu")
    Producer(channel).publish({"generation_id": 1}, routing_key="gpu", declare=[tasks])
    delivered = []
    Consumer(channel, [tasks], no_ack=False, callbacks=[lambda body, message: delivered.append(message)]).consume()
    control = Queue("worker.pidbox", Exchange("worker.pidbox", type="fanout"), auto_delete=True)
    Consumer(connection.channel(), [control], no_ack=True, callbacks=[lambda body, message: None]).consume()
    for _ in range(3):  # deliver the task, then poll once more: a BRPOP stays in flight
        try:
            connection.drain_events(timeout=0.3)
        except TimeoutError:  # socket.timeout: nothing more arrived
            pass
    assert len(delivered) == 1 and not delivered[0].acknowledged and channel._in_poll
    return connection


def tear_down_as_the_consumer_does(connection: Connection) -> None:
    """Celery 5.7's `Consumer.on_connection_error_after_connected`: collect the connection (its
    errors ignored), then close it with only connection and channel errors ignored."""
    try:
        connection.collect(socket_timeout=COLLECT_SOCKET_TIMEOUT_S)
    except Exception:  # as Celery does
        pass
    ignore_errors(connection, connection.close)


def test_kombus_own_transport_still_fails_so_the_playground_needs_its_own(doomed_redis: tuple[Service, str]) -> None:
    """The bug itself. When this fails after a kombu or Celery upgrade, they fixed it: drop
    playground/broker.py and `CELERY_BROKER_TRANSPORT`."""
    service, url = doomed_redis
    connection = connection_running_a_task(url, KOMBU_TRANSPORT)
    service.kill()
    with pytest.raises(AttributeError, match="hostname"):
        tear_down_as_the_consumer_does(connection)


def test_the_playground_transport_closes_the_channel_after_redis_died_under_a_task(
    doomed_redis: tuple[Service, str],
) -> None:
    service, url = doomed_redis
    connection = connection_running_a_task(url, PLAYGROUND_TRANSPORT)
    channel = connection.default_channel
    service.kill()
    tear_down_as_the_consumer_does(connection)  # nothing escapes: the consumer retries
    assert channel.closed and not channel._in_poll
