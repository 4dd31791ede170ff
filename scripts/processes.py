"""`Service`: one child process in its own process group, stoppable without orphans.

Owns: starting a command (log to a file, or to our stdout with a name prefix), telling
whether it still runs, and stopping it (SIGTERM to the whole group, then SIGKILL after a
grace period). On Linux the child also gets SIGKILL if the process that started it dies,
so a crashed supervisor or test run leaves nothing behind.
Must not know: what the command is (Redis, Celery, daphne are the callers' business).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO

PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up now: the child must not load libraries between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not glibc-like: no safety net, stop() still works
        return None


_prctl = _load_prctl()


def _die_with_parent() -> None:
    """Runs in the child between fork and exec: ask for SIGKILL when the parent dies."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class Service:
    """A named command run as the leader of a new session (its own process group), so a
    terminal's Ctrl-C reaches only the supervisor, which then stops children in order."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        log_path: Path | None = None,
        prefix_output: bool = False,
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.log_path = log_path
        self.prefix_output = prefix_output
        self.process: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None
        self._is_cleaned_up = False  # the group was killed once: its pgid may be reused now

    def start(self) -> "Service":
        stdout: int | IO[bytes] | None = None
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "wb")  # one run per file: restarts use new names
            stdout = self._log_file
        elif self.prefix_output:
            stdout = subprocess.PIPE
        preexec = _die_with_parent if _prctl is not None else None
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.STDOUT if stdout is not None else None,
            start_new_session=True,
            preexec_fn=preexec,
        )
        if stdout is subprocess.PIPE:
            threading.Thread(target=self._copy_prefixed, daemon=True, name=f"{self.name}-output").start()
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to `grace_s`, then SIGKILL whatever is left."""
        if self.process is None:
            return None
        if self.is_alive():
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def kill(self) -> int | None:
        """SIGKILL the whole group at once (also how tests simulate a crash)."""
        if self.process is None:
            return None
        if not self._is_cleaned_up:
            self._signal_group(signal.SIGKILL)  # also ends grandchildren the leader left behind
            self._is_cleaned_up = True
        code = self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return code

    def log_tail(self, num_lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            lines = deque(f, maxlen=num_lines)
        return b"".join(lines).decode("utf-8", errors="replace")

    def log_hint(self, num_lines: int = 40) -> str:
        """A ready-to-append error suffix: the log's last lines, or nothing."""
        tail = self.log_tail(num_lines)
        return f"\n--- last {num_lines} lines of {self.log_path} ---\n{tail}" if tail else ""

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pid, sig)  # pgid == pid: the child is its session's leader
        except (ProcessLookupError, PermissionError):
            pass

    def _copy_prefixed(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        label = f"{self.name:>6} | ".encode()
        out = sys.stdout.buffer
        for line in self.process.stdout:
            out.write(label + line)
            out.flush()
