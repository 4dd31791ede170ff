"""The worker side of the beacon: this process's liveness keys, kept alive by a child process.

A heartbeat thread in the worker process needs the GIL to beat, and the worker process is where
the GIL is busiest: a model load or GGUF conversion, a 10,000-message prompt's template, an
inspection, or only a machine loaded by other processes held it past a 3-second key's life, and
healthy generations were declared `worker_lost` while their worker went on (issue 46). So the
beats come from a child process (`beacon_child.py`, stdlib + redis only) that this process only
tells which keys to keep, through a pipe: a write of a few bytes that never waits on Redis.

Owns: the child (started on first use, started again if it died, one per process and Redis URL),
the keys it keeps (so a restarted child gets them all again) and the pulse, a thread that tells
the child every second that this process still runs Python (`beacon_child` lets a worker silent
for `PLAYGROUND_WORKER_STALL_S` go quiet). Must not know: what the keys mean (`liveness` does).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis
from django.conf import settings

from playground.coord import store

logger = logging.getLogger(__name__)

CHILD_PATH = Path(__file__).with_name("beacon_child.py")
PULSE_INTERVAL_S = 1.0
ACK_TIMEOUT_S = 2.0  # a drop's wait for the child's word before this process deletes the key itself


class Beacon:
    """Keeps keys alive from a child process; `beat(key, ttl_s)` until `drop(key)`."""

    def __init__(self, redis_url: str, interval_s: float, stall_s: float) -> None:
        self.redis_url, self.interval_s, self.stall_s = redis_url, interval_s, stall_s
        self.kept: dict[str, dict[str, Any]] = {}  # key -> its beat command (sent again to a new child)
        self.lock = threading.Lock()
        self.child: subprocess.Popen[bytes] | None = None
        self.acks: dict[int, threading.Event] = {}  # drops waiting for the child's word
        self.ack_ids = itertools.count(1)
        self.pulse = threading.Thread(target=self._pulse_forever, name="beacon-pulse", daemon=True)
        self.pulse.start()

    def beat(self, key: str, ttl_s: float, value: str = "1") -> None:
        """Keeps `key` = `value` alive (expiring `ttl_s` after the last beat) until `drop(key)`;
        the key exists when this returns (written here once, then by the child)."""
        command = {"op": "beat", "key": key, "ttl_ms": int(ttl_s * 1000), "value": value}
        with contextlib.suppress(redis.RedisError):
            store.client().set(key, value, px=command["ttl_ms"])
        with self.lock:
            self.kept[key] = command
            self._send(command)

    def drop(self, key: str, hold_s: float | None = None) -> None:
        """Stops beating `key`: it is deleted, or left to live `hold_s` more, when this returns
        (the child says so; without its word within ACK_TIMEOUT_S this process does it)."""
        done = threading.Event()
        with self.lock:
            ack = next(self.ack_ids)
            self.acks[ack] = done
            command: dict[str, Any] = {"op": "drop", "key": key, "ack": ack}
            if hold_s is not None:
                command["hold_ms"] = int(hold_s * 1000)
            self.kept.pop(key, None)
            self._send(command)
        if done.wait(ACK_TIMEOUT_S):
            return
        with self.lock:
            self.acks.pop(ack, None)
        with contextlib.suppress(redis.RedisError):
            if hold_s is None:
                store.client().delete(key)
            else:
                store.client().set(key, 1, px=command["hold_ms"])

    def close(self) -> None:
        """Ends the child (its keys expire on their own; drop them first to delete them)."""
        with self.lock:
            if self.child is not None and self.child.stdin is not None:
                with contextlib.suppress(OSError):
                    self.child.stdin.close()
                self.child.wait(timeout=5)
            self.child = None

    def _send(self, command: dict[str, Any]) -> None:
        """One line to the child (under `lock`); a dead child is replaced and given every key."""
        line = json.dumps(command).encode() + b"\n"
        for _ in range(2):
            child = self._running_child()
            try:
                assert child.stdin is not None
                child.stdin.write(line)
                child.stdin.flush()
                return
            except (BrokenPipeError, ValueError, OSError) as exc:
                logger.warning("the beacon process ended (%s); starting another", exc)
                self.child = None

    def _running_child(self) -> subprocess.Popen[bytes]:
        if self.child is not None and self.child.poll() is None:
            return self.child
        if self.child is not None:
            logger.warning("the beacon process exited with %s; starting another", self.child.returncode)
        self.child = subprocess.Popen(
            [sys.executable, str(CHILD_PATH), self.redis_url, str(self.interval_s), str(self.stall_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        threading.Thread(target=self._read_acks, args=(self.child,), name="beacon-acks", daemon=True).start()
        assert self.child.stdin is not None
        for command in self.kept.values():  # a new child knows nothing yet
            self.child.stdin.write(json.dumps(command).encode() + b"\n")
        self.child.stdin.flush()
        return self.child

    def _read_acks(self, child: subprocess.Popen[bytes]) -> None:
        """Sets each drop's event as the child reports it done (until that child ends)."""
        assert child.stdout is not None
        for line in child.stdout:
            with self.lock:
                done = self.acks.pop(int(line), None)
            if done is not None:
                done.set()

    def _pulse_forever(self) -> None:
        while True:
            time.sleep(PULSE_INTERVAL_S)
            with self.lock:
                if self.kept:
                    self._send({"op": "pulse"})


_beacons: dict[tuple[Any, ...], Beacon] = {}
_beacons_lock = threading.Lock()


def get() -> Beacon:
    """This process's beacon for the current settings (a forked child gets its own)."""
    url, interval_s, stall_s = (
        settings.REDIS_URL,
        settings.PLAYGROUND_HEARTBEAT_INTERVAL_S,
        settings.PLAYGROUND_WORKER_STALL_S,
    )
    key = (os.getpid(), url, interval_s, stall_s)
    with _beacons_lock:
        if key not in _beacons:
            _beacons[key] = Beacon(url, interval_s, stall_s)
        return _beacons[key]
