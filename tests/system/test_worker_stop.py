"""A worker stopped politely (SIGTERM, as a supervisor or `docker stop` does) ends its running
generations itself: one `worker_lost` each with the partial answer kept, and no row left
`running` for the next reader to discover; the supervisor's new worker serves the next request."""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest

from tests.system.test_supervisor import Supervised, is_running, supervised  # noqa: F401 (fixture)
from tests.system.wsclient import BrowserTab, ends_request, receive_until, send, steps_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def test_sigterm_ends_running_generations_at_once_and_leaves_no_row_running(
    supervised: Supervised,  # noqa: F811
) -> None:
    url = supervised.wait_for(r"Open (http://\S+)")[1].rstrip("/")
    pids = supervised.child_pids()
    tab = BrowserTab(url, url.replace("http://", "ws://") + "/ws/generate/")
    assert tab.get("/")[0] == 200
    with tab.connect() as ws:
        send(ws, "generate", content="Tell me a long story.", overrides={"max_new_tokens": 2000, "ignore_eos": True})
        streamed = receive_until(ws, lambda e: bool(steps_of([e])) or ends_request(e), timeout_s=180)
        assert not ends_request(streamed[-1]), streamed[-1]
        os.kill(pids["worker"], signal.SIGTERM)
        stopped_at = time.monotonic()
        events = receive_until(ws, ends_request, timeout_s=30)
        ended_after_s = time.monotonic() - stopped_at
    terminal = [e for e in streamed + events if ends_request(e)]
    assert [(e["type"], e["code"]) for e in terminal] == [("generation.error", "worker_lost")], terminal
    assert "was stopped" in terminal[0]["message"]
    assert ended_after_s < 10  # at its next step, not after the heartbeat's TTL or the kill

    # The row says so by itself (read straight from the database: the API would apply the lost rule).
    database = supervised.env["DATABASE_URL"].removeprefix("sqlite:///")
    with sqlite3.connect(database) as db:
        status, code, text = db.execute(
            "SELECT status, error_code, text FROM playground_generation WHERE id = ?", (streamed[0]["generation_id"],)
        ).fetchone()
    assert (status, code) == ("error", "worker_lost") and text

    new_pid = int(supervised.wait_for(r"started worker \(pid (\d+)\)", timeout_s=60)[1])
    assert new_pid != pids["worker"] and not is_running(pids["worker"])
    with tab.connect() as ws:
        send(ws, "generate", content="Name a colour.", overrides={"max_new_tokens": 4, "ignore_eos": True})
        events = receive_until(ws, ends_request, timeout_s=240)
    assert events[-1]["type"] == "generation.finished", events[-1]
