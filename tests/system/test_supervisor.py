"""scripts/run.py (`make run`): starts Redis, a worker and the web server; Ctrl-C or a dead
child stops everything, leaving no process behind."""

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

REPO_DIR = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

START_TIMEOUT_S = 180


class Supervised:
    """scripts/run.py as a child, its output read line by line on a thread."""

    def __init__(self, env: dict[str, str]) -> None:
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
        PLAYGROUND_DATA_DIR=str(tmp_path / "data"),
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


def test_a_dead_child_is_named_and_the_rest_are_stopped(supervised: Supervised) -> None:
    supervised.wait_for(r"Open http://")
    pids = supervised.child_pids()
    os.kill(pids["worker"], signal.SIGKILL)

    supervised.wait_for(rf"worker \(pid {pids['worker']}\) exited")
    assert supervised.finish() == 1
    assert [name for name, pid in pids.items() if is_running(pid)] == []
