"""Losing Redis under `make run`'s supervisor (scripts/run.py) is an outage, not data loss: Redis
killed mid-stream gives every running or queued generation on an open socket exactly one
terminal event (`service_unavailable`, never a raw connection error), idle sockets stay open,
the worker process survives and reconnects, the queued rows end or run, and once the supervisor
has restarted Redis the next requests succeed (nobody's slots stay taken)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.system.test_supervisor import Supervised, is_running, supervised  # noqa: F401 (fixture)
from tests.system.wsclient import BrowserTab, ends_request, receive, receive_until, send, steps_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LONG = {"max_new_tokens": 2000, "greedy": True, "ignore_eos": True}
SHORT = {"max_new_tokens": 4, "greedy": True, "ignore_eos": True}
NUM_USERS = 3


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
