"""The beacon's child process: writes a worker's liveness keys to Redis on a clock of its own.

Run by `playground.coord.beacon` as `python beacon_child.py REDIS_URL INTERVAL_S STALL_S` with a pipe
on its standard input; it imports only the standard library and redis-py (no Django, no torch), so
it starts in a fraction of a second and nothing in the worker process (the GIL held by a model
load, a GGUF conversion, a huge prompt's template, a machine loaded by other processes) delays its
beats: the kernel schedules it as a process of its own.

The pipe carries one JSON object a line:
- `{"op": "beat", "key": K, "ttl_ms": T, "value": V}`: keep K = V alive (SET PX T every interval);
- `{"op": "drop", "key": K, "ack": N}`: stop, and delete K; with `"hold_ms": H`: stop, leaving K
  for H ms (the prefill worker's handoff to its decode worker); then N is written back, a line on
  standard output, once no beat of K can come any more;
- `{"op": "pulse"}`: the worker process still runs Python (sent every second by one of its threads).

Two rules make a lost verdict true and quick: the end of the pipe (the worker process is gone,
however it died: a crash, SIGKILL, the OOM killer) deletes every key it kept and ends this
process, so the web side sees the loss within its next checks, not a TTL later (a host that loses
its link can delete nothing: there the TTL says it); and a worker that sends nothing for STALL_S
(wedged far longer than any model load) is let go silent: the keys expire until it speaks again.
Must not know: what the keys mean.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from typing import Any

import redis


class Keys:
    """The keys being kept alive, and the Redis writes that keep them."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.kept: dict[str, tuple[str, int]] = {}  # key -> (value, ttl_ms)
        self.is_failing = False

    def apply(self, command: dict[str, Any]) -> None:
        op, key = command.get("op"), command.get("key")
        if op == "beat":
            self.kept[key] = (str(command.get("value", "1")), int(command["ttl_ms"]))
            self.write({key: self.kept[key]})  # exists as soon as the worker asked
        elif op == "drop":
            self.kept.pop(key, None)
            hold_ms = command.get("hold_ms")
            self.guarded(lambda: self.client.set(key, 1, px=int(hold_ms)) if hold_ms else self.client.delete(key))
            # The worker waits for this: no beat of the key can follow it (a delete made by the
            # worker itself could be undone by a beat already on its way).
            sys.stdout.write(f"{command.get('ack', 0)}\n")
            sys.stdout.flush()

    def delete_all(self) -> None:
        kept, self.kept = list(self.kept), {}
        if kept:
            self.guarded(lambda: self.client.delete(*kept))

    def beat_all(self) -> None:
        self.write(self.kept)

    def write(self, entries: dict[str, tuple[str, int]]) -> None:
        def send() -> None:
            with self.client.pipeline(transaction=False) as pipe:
                for key, (value, ttl_ms) in entries.items():
                    pipe.set(key, value, px=ttl_ms)
                pipe.execute()

        if entries:
            self.guarded(send)

    def guarded(self, write: Any) -> None:
        """One Redis write; an outage is said once (to the worker's log) and the beats go on."""
        try:
            write()
        except (redis.RedisError, OSError) as exc:
            if not self.is_failing:
                print(f"beacon: Redis unreachable, retrying every beat: {exc}", file=sys.stderr, flush=True)
            self.is_failing = True
        else:
            if self.is_failing:
                print("beacon: Redis answers again", file=sys.stderr, flush=True)
            self.is_failing = False


def read_commands(fd: int, pending: bytearray) -> list[dict[str, Any]] | None:
    """The complete lines the pipe holds now, parsed; None at its end (the worker is gone)."""
    chunk = os.read(fd, 65536)
    if not chunk:
        return None
    pending += chunk
    *lines, rest = pending.split(b"\n")
    pending[:] = rest
    return [json.loads(line) for line in lines if line.strip()]


def serve(redis_url: str, interval_s: float, stall_s: float) -> None:
    client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
    keys = Keys(client)
    fd = sys.stdin.fileno()
    pending = bytearray()
    heard_at = next_beat = time.monotonic()
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, next_beat - time.monotonic()))
        if ready:
            commands = read_commands(fd, pending)
            if commands is None:  # the worker process ended, however it died: its keys go now
                keys.delete_all()
                return
            heard_at = time.monotonic()
            for command in commands:
                keys.apply(command)
        now = time.monotonic()
        if now >= next_beat:
            if now - heard_at < stall_s:
                keys.beat_all()
            next_beat = now + interval_s


if __name__ == "__main__":
    url, interval, stall = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    try:
        serve(url, interval, stall)
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: the worker says its own goodbye
        pass
