"""scripts/run.py (`make run`): starts Redis, a worker and the web server; Ctrl-C stops
everything, leaving no process behind; a crashed worker is restarted while the site stays up."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.net import free_port, http_status
from tests.system.wsclient import BrowserTab, ends_request, receive_until, send, steps_of

REPO_DIR = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

START_TIMEOUT_S = 180


class Supervised:
    """scripts/run.py as a child, its output read line by line on a thread."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "scripts/run.py"],
            cwd=REPO_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout_s: float = START_TIMEOUT_S) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                break
            self.output.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no line matching {pattern!r}; output so far:\n" + "\n".join(self.output[-80:]))

    def child_pids(self) -> dict[str, int]:
        return {m[1]: int(m[2]) for line in self.output if (m := re.search(r"started (\w+) \(pid (\d+)\)", line))}

    def finish(self, timeout_s: float = 60) -> int:
        code = self.process.wait(timeout=timeout_s)
        while not self.lines.empty():
            self.output.append(self.lines.get())
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def is_running(pid: int) -> bool:
    """Alive and not a zombie (Linux /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def supervised(tmp_path: Path) -> Iterator[Supervised]:
    """run.py on free ports with a private data dir and DB (migrated), and no Redis running
    at REDIS_URL, so it must start its own."""
    env = dict(
        os.environ,
        PORT=str(free_port()),
        # The repo's data dir holds the converted bundled model (the worker needs it); Redis,
        # started by run.py on its own free port, keeps its files under it too.
        PLAYGROUND_DATA_DIR=os.environ.get("PLAYGROUND_DATA_DIR", str(REPO_DIR / "data")),
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        DJANGO_SETTINGS_MODULE="playground.settings",
    )
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=REPO_DIR,
        env=env,
        check=True,
        timeout=300,
    )
    run = Supervised(env)
    try:
        yield run
    finally:
        run.kill()


def test_ctrl_c_stops_every_child(supervised: Supervised) -> None:
    url = supervised.wait_for(r"Open (http://\S+)")[1]
    assert http_status(url) == 200
    pids = supervised.child_pids()
    assert set(pids) == {"redis", "worker", "web"}
    assert all(is_running(pid) for pid in pids.values())

    supervised.process.send_signal(signal.SIGINT)
    assert supervised.finish() == 0
    assert [name for name, pid in pids.items() if is_running(pid)] == []


def test_a_killed_worker_costs_its_user_one_worker_lost_and_is_restarted_while_the_site_stays_up(
    supervised: Supervised,
) -> None:
    url = supervised.wait_for(r"Open (http://\S+)")[1].rstrip("/")
    pids = supervised.child_pids()
    tab = BrowserTab(url, url.replace("http://", "ws://") + "/ws/generate/")
    assert tab.get("/")[0] == 200
    with tab.connect() as ws:
        send(
            ws,
            "generate",
            request_id="r1",
            content="Tell me a long story.",
            overrides={"max_new_tokens": 2000, "greedy": True, "ignore_eos": True},
        )
        streamed = receive_until(ws, lambda e: len(steps_of([e])) > 0 or ends_request(e), timeout_s=180)
        assert not ends_request(streamed[-1]), streamed[-1]
        time.sleep(1.5)  # the worker saves the partial answer about once a second
        os.kill(pids["worker"], signal.SIGKILL)
        killed_at = time.monotonic()
        events = receive_until(ws, ends_request, timeout_s=30)
        lost_after_s = time.monotonic() - killed_at
        assert http_status(url + "/") == 200  # the web server never went down
    terminal = [e for e in streamed + events if ends_request(e)]
    assert [(e["type"], e.get("code")) for e in terminal] == [("generation.error", "worker_lost")]
    assert lost_after_s < 10
    conversation = tab.get_json(f"/api/conversations/{streamed[0]['conversation_id']}/")[1]
    assert conversation["messages"][-1]["content"]  # the partial answer was kept

    new_pid = int(supervised.wait_for(r"started worker \(pid (\d+)\)", timeout_s=60)[1])
    assert new_pid != pids["worker"] and is_running(new_pid) and is_running(pids["web"])
    with tab.connect() as ws:
        send(
            ws,
            "generate",
            request_id="r2",
            content="Name a colour.",
            overrides={"max_new_tokens": 4, "greedy": True, "ignore_eos": True},
        )
        events = receive_until(ws, ends_request, timeout_s=180)
    assert events[-1]["type"] == "generation.finished", events[-1]
