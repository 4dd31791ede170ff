"""Losing Redis under `make run`'s supervisor (scripts/run.py) is an outage, not data loss: Redis
killed mid-stream gives every running or queued generation on an open socket exactly one
terminal event (`service_unavailable`, never a raw connection error), idle sockets stay open,
the worker process survives and reconnects, the queued rows end or run, and once the supervisor
has restarted Redis the next requests succeed (nobody's slots stay taken). The worker that
reconnects is the same process (same pid), and it answers the next request (issue 46: it used to
exit with kombu's AttributeError and be replaced by the supervisor; playground/broker.py)."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError

from tests.system.test_supervisor import Supervised, is_running, supervised  # noqa: F401 (fixture)
from tests.system.wsclient import BrowserTab, ends_request, receive, receive_until, send, steps_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LONG = {"max_new_tokens": 2000, "greedy": True, "ignore_eos": True}
SHORT = {"max_new_tokens": 4, "greedy": True, "ignore_eos": True}
NUM_USERS = 3
# The supervisor's lines that say how a worker ended: Celery's last words, then run.py's.
DEATH_LINE = r"Unrecoverable error|AttributeError|worker \(pid \d+\) exited"


@pytest.fixture
def two_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker with two places in its batch: three users' first answers run two, queue one."""
    monkeypatch.setenv("PLAYGROUND_WORKER_SLOTS", "2")


def test_redis_killed_mid_stream_is_one_service_unavailable_per_generation_and_then_service_resumes(
    two_slots: None,
    supervised: Supervised,  # noqa: F811
) -> None:
    url = supervised.wait_for(r"Open (http://\S+)")[1].rstrip("/")
    pids = supervised.child_pids()
    tabs = [BrowserTab(url, url.replace("http://", "ws://") + "/ws/generate/") for _ in range(NUM_USERS + 1)]
    assert all(tab.get("/")[0] == 200 for tab in tabs)
    sockets = [tab.connect() for tab in tabs]
    users, idle = sockets[:NUM_USERS], sockets[NUM_USERS]
    try:
        queued = []
        for number, ws in enumerate(users):
            send(ws, "generate", request_id=f"r{number}", content="Tell me a long story.", overrides=LONG)
            queued.append(receive(ws, timeout_s=60))
        assert [e["type"] for e in queued] == ["generation.queued"] * NUM_USERS
        # Two stream (the batch's two places), the third waits in the queue.
        streaming = receive_until(users[0], lambda e: bool(steps_of([e])) or ends_request(e))
        assert not ends_request(streaming[-1]), streaming[-1]
        time.sleep(1.0)

        os.kill(pids["redis"], signal.SIGKILL)
        killed_at = time.monotonic()
        terminal = []
        for ws in users:
            events = receive_until(ws, ends_request, timeout_s=60)
            terminal.append((events[-1], time.monotonic() - killed_at))
        for event, _ in terminal:
            assert (event["type"], event["code"]) == ("generation.error", "service_unavailable"), event
            assert "Error 111" not in event["message"] and "connecting" not in event["message"], event
        assert max(seconds for _, seconds in terminal) < 20

        supervised.wait_for(r"started redis \(pid \d+\)", timeout_s=60)
        for ws in users + [idle]:  # exactly one terminal event each: nothing more arrives
            with pytest.raises(TimeoutError):
                print("unexpected", receive(ws, timeout_s=2))
        assert is_running(pids["worker"]) and is_running(pids["web"])

        # Every user can start as many answers as before (no slot stayed taken), on the socket
        # that saw the outage; the idle socket was never closed.
        for number, ws in enumerate(users + [idle]):
            for attempt in range(2):
                send(ws, "generate", request_id=f"again-{number}-{attempt}", content="Name a colour.", overrides=SHORT)
            events = receive_until(ws, ends_request, timeout_s=240)
            events += receive_until(ws, ends_request, timeout_s=240)
            ends = [e for e in events if ends_request(e)]
            assert [e["type"] for e in ends] == ["generation.finished"] * 2, ends
    finally:
        for ws in sockets:
            ws.close()
    # The records say what the sockets were told, and nothing stays queued or running.
    for tab, event in zip(tabs, queued):
        record = tab.get_json(f"/api/generations/{event['generation_id']}/")[1]
        assert (record["status"], record["error"]["code"]) == ("error", "service_unavailable"), record
    assert is_running(pids["worker"])  # the worker process survived (a restarted one has a new pid)


def worker_stats(redis_url: str, node: str) -> dict[str, Any]:
    """The node's own `stats` (its `pid` among them) over Celery's remote control, {} if it did
    not answer in a second: asked through the broker, so only a worker connected to it answers."""
    app = Celery("e2e-probe", broker=redis_url, set_as_current=False)
    try:
        return (app.control.inspect(destination=[node], timeout=1.0).stats() or {}).get(node, {})
    except (OSError, OperationalError, redis.RedisError):  # Redis still starting
        return {}
    finally:
        app.close()


def why_the_worker_died(run: Supervised) -> str:
    """The supervisor's lines so far that say how the worker ended (its log is in the same stream)."""
    while not run.lines.empty():
        run.output.append(run.lines.get())
    return "\n".join(line for line in run.output if re.search(DEATH_LINE, line))


def wait_until_reconnected(run: Supervised, node: str, worker_pid: int, timeout_s: float = 60) -> int:
    """The pid the node reports once it answers through the restarted Redis; fails at once if the
    original worker process is gone (the supervisor's replacement would answer under its name)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert is_running(worker_pid), f"the worker (pid {worker_pid}) exited:\n{why_the_worker_died(run)}"
        if pid := worker_stats(run.env["REDIS_URL"], node).get("pid"):
            return pid
        time.sleep(0.5)
    raise AssertionError(f"{node} did not answer through the restarted Redis within {timeout_s} s")


def generate_once_accepted(ws: Any, request_id: str, timeout_s: float = 30) -> list[dict[str, Any]]:
    """Sends a short generation until the web process accepts it (while its own probe has not seen
    Redis back yet it refuses with `service_unavailable`), then reads it to its end."""
    deadline = time.monotonic() + timeout_s
    while True:
        send(ws, "generate", request_id=request_id, content="Name a colour.", overrides=SHORT)
        first = receive(ws, timeout_s=60)
        if first.get("type") != "error" or first.get("code") != "service_unavailable":
            break
        assert time.monotonic() < deadline, first
        time.sleep(0.5)
    return [first] if ends_request(first) else [first, *receive_until(ws, ends_request, timeout_s=180)]


def test_the_worker_process_survives_redis_killed_mid_generation_and_answers_the_next_request(
    supervised: Supervised,  # noqa: F811
) -> None:
    url = supervised.wait_for(r"Open (http://\S+)")[1].rstrip("/")
    redis_url, worker_pid = supervised.env["REDIS_URL"], supervised.child_pids()["worker"]
    tab = BrowserTab(url, url.replace("http://", "ws://") + "/ws/generate/")
    assert tab.get("/")[0] == 200
    with tab.connect() as ws:
        # A generation runs: its task message is delivered and not yet acknowledged (acks_late),
        # the state in which losing Redis made the worker exit.
        send(ws, "generate", request_id="long", content="Tell me a long story.", overrides=LONG)
        started = receive_until(ws, lambda e: e["type"] == "generation.started" or ends_request(e))[-1]
        assert started["type"] == "generation.started", started
        node = started["worker"]
        assert worker_stats(redis_url, node).get("pid") == worker_pid
        streaming = receive_until(ws, lambda e: bool(steps_of([e])) or ends_request(e))
        assert not ends_request(streaming[-1]), streaming[-1]

        os.kill(supervised.child_pids()["redis"], signal.SIGKILL)
        killed_at = time.monotonic()
        ended = receive_until(ws, ends_request, timeout_s=60)[-1]
        assert (ended["type"], ended.get("code")) == ("generation.error", "service_unavailable"), ended
        supervised.wait_for(r"started redis \(pid \d+\)", timeout_s=60)
        restarted_at = time.monotonic()

        assert wait_until_reconnected(supervised, node, worker_pid) == worker_pid
        reconnected_at = time.monotonic()
        print(
            f"Redis restarted {restarted_at - killed_at:.1f} s after the kill; the worker (pid {worker_pid})"
            f" answered through it {reconnected_at - killed_at:.1f} s after the kill"
        )
        events = generate_once_accepted(ws, "after")
    starts = [e for e in events if e["type"] == "generation.started"]
    assert events[-1]["type"] == "generation.finished", events[-1]
    assert [e["worker"] for e in starts] == [node]
    assert worker_stats(redis_url, node).get("pid") == worker_pid and is_running(worker_pid)
