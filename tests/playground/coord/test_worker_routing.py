"""Cache-aware routing against a real Redis (the session's private server, its own DB)."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from playground.coord import worker_routing as wr

ROUTING_DB = 11  # not the broker/channel-layer DB other tests of the session may use


@pytest.fixture
def r(redis_url: str):
    parts = urlsplit(redis_url)
    client = redis.Redis.from_url(urlunsplit(parts._replace(path=f"/{ROUTING_DB}")))
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def make_alive(r: redis.Redis, worker_name: str) -> None:
    r.set(wr.alive_key(worker_name), 1, ex=5)


def test_new_conversation_goes_to_the_shared_queue(r):
    assert wr.choose_queue(r, 1) == "gpu"
    assert wr.choose_queue(r, None) == "gpu"


def test_alive_idle_owner_gets_its_conversation(r):
    make_alive(r, "w1@host")
    wr.record_owner(r, 7, "w1@host")
    assert wr.owner_of(r, 7) == "w1@host"
    assert wr.choose_queue(r, 7) == "gpu.w1@host"
    assert wr.choose_queue(r, 8) == "gpu"  # another conversation has no owner


def test_dead_owner_falls_back_to_the_shared_queue(r):
    wr.record_owner(r, 7, "w1@host")  # no heartbeat key: the worker is gone
    assert wr.choose_queue(r, 7) == "gpu"


def test_busy_owner_falls_back_until_idle(r):
    make_alive(r, "w1@host")
    wr.record_owner(r, 7, "w1@host")
    wr.set_busy(r, "w1@host", True)
    assert wr.choose_queue(r, 7) == "gpu"
    wr.set_busy(r, "w1@host", False)
    assert wr.choose_queue(r, 7) == "gpu.w1@host"


def test_the_latest_owner_wins(r):
    make_alive(r, "w1@host")
    make_alive(r, "w2@host")
    wr.record_owner(r, 7, "w1@host")
    wr.record_owner(r, 7, "w2@host")
    assert wr.choose_queue(r, 7) == "gpu.w2@host"


def test_busy_flag_does_not_look_like_a_live_worker(r):
    """liveness counts `playground:worker:*` keys as live workers."""
    wr.set_busy(r, "w1@host", True)
    assert list(r.scan_iter(match="playground:worker:*")) == []


def test_routing_falls_back_to_the_shared_queue_when_redis_is_down():
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    unreachable = redis.Redis(port=port, socket_connect_timeout=1)
    assert wr.route(unreachable, 1, conversation_id=7) == "gpu"


def test_claim_delivery_is_exclusive(r):
    assert wr.claim_delivery(r, 42, "w1@host") is True
    assert wr.claim_delivery(r, 42, "w2@host") is False
    assert wr.claim_delivery(r, 42, "w1@host") is False  # not even the same worker twice
    assert wr.claimed_by(r, 42) == "w1@host"
    assert wr.claim_delivery(r, 43, "w2@host") is True


class FakeBroker:
    """Queues as lists; `run_next` is what a worker does with a message: claim, then run."""

    def __init__(self) -> None:
        self.queues: dict[str, list[int]] = {}
        self.runs: list[tuple[int, str]] = []

    def send(self, queue: str, generation_id: int) -> None:
        self.queues.setdefault(queue, []).append(generation_id)

    def run_next(self, r: redis.Redis, queue: str, worker_name: str) -> None:
        generation_id = self.queues[queue].pop(0)
        if wr.claim_delivery(r, generation_id, worker_name):
            self.runs.append((generation_id, worker_name))


def send_routed(r: redis.Redis, broker: FakeBroker, generation_id: int, conversation_id: int) -> str:
    queue = wr.route(r, generation_id, conversation_id)
    broker.send(queue, generation_id)
    return queue


def test_shared_queue_requests_are_never_rerouted(r):
    broker = FakeBroker()
    assert send_routed(r, broker, 1, conversation_id=5) == "gpu"
    assert wr.reroute_if_unclaimed(r, 1, lambda q: broker.send(q, 1), timeout_s=0) is False
    assert broker.queues == {"gpu": [1]}


def test_owner_dies_before_claiming_reroute_then_late_original_runs_once(r):
    broker = FakeBroker()
    make_alive(r, "w1@host")
    make_alive(r, "w2@host")
    wr.record_owner(r, 5, "w1@host")
    assert send_routed(r, broker, 1, conversation_id=5) == "gpu.w1@host"

    # owner alive, not yet past the timeout: leave it alone
    assert wr.reroute_if_unclaimed(r, 1, lambda q: broker.send(q, 1), timeout_s=3600) is False
    r.delete(wr.alive_key("w1@host"))  # w1 dies (its heartbeat expires)
    assert wr.reroute_if_unclaimed(r, 1, lambda q: broker.send(q, 1), timeout_s=3600) is True
    assert wr.reroute_if_unclaimed(r, 1, lambda q: broker.send(q, 1), timeout_s=3600) is False  # once only
    assert broker.queues == {"gpu.w1@host": [1], "gpu": [1]}

    broker.run_next(r, "gpu", "w2@host")  # the re-sent copy
    broker.run_next(r, "gpu.w1@host", "w1@host")  # w1 restarts and finds the original: a no-op
    assert broker.runs == [(1, "w2@host")]


def test_slow_owner_is_passed_over_after_the_timeout_and_its_late_claim_is_a_no_op(r):
    broker = FakeBroker()
    make_alive(r, "w1@host")
    wr.record_owner(r, 5, "w1@host")
    send_routed(r, broker, 1, conversation_id=5)
    assert wr.reroute_if_unclaimed(r, 1, lambda q: broker.send(q, 1), timeout_s=0) is True
    broker.run_next(r, "gpu.w1@host", "w1@host")  # the original wins the race this time
    broker.run_next(r, "gpu", "w2@host")
    assert broker.runs == [(1, "w1@host")]


def test_claimed_request_is_not_rerouted(r):
    broker = FakeBroker()
    make_alive(r, "w1@host")
    wr.record_owner(r, 5, "w1@host")
    send_routed(r, broker, 1, conversation_id=5)
    broker.run_next(r, "gpu.w1@host", "w1@host")
    r.delete(wr.alive_key("w1@host"))  # dies after claiming: liveness' job, not a re-send
    assert wr.reroute_if_unclaimed(r, 1, lambda q: broker.send(q, 1), timeout_s=0) is False
    assert broker.runs == [(1, "w1@host")]
    assert broker.queues == {"gpu.w1@host": []}
