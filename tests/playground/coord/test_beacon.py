"""The beacon: a worker's liveness keys outlive any pause of the worker's own Python, and die with
its process (issue 46: healthy generations declared `worker_lost` while a model loaded)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

from playground.coord import beacon, liveness, store

pytestmark = pytest.mark.django_db

# Counts, from a process of its own, the polls that found the key missing over `seconds`.
WATCHER = textwrap.dedent(
    """
    import sys, time, redis
    r = redis.Redis.from_url(sys.argv[1])
    key, deadline, misses = sys.argv[2], time.monotonic() + float(sys.argv[3]), 0
    print("watching", flush=True)
    while time.monotonic() < deadline:
        misses += not r.exists(key)
        time.sleep(0.05)
    print(misses, flush=True)
    """
)


def hold_the_gil(seconds: int) -> None:
    """libc's sleep through PyDLL, which keeps the GIL: no other thread of this process runs
    Python meanwhile, as inside a long C call that does not release it (the worst model load)."""
    ctypes.PyDLL(None).sleep(seconds)


def test_a_generation_stays_alive_while_its_worker_holds_the_gil_past_the_ttl(owner: str, settings: Any) -> None:
    from tests.playground.conftest import make_generation

    settings.PLAYGROUND_HEARTBEAT_TTL_S, settings.PLAYGROUND_HEARTBEAT_INTERVAL_S = 1.0, 0.2
    generation = make_generation(owner, status="running")
    key = liveness.generation_key(generation.pk)
    with liveness.generation_heartbeat(generation.pk):
        watcher = subprocess.Popen(
            [sys.executable, "-c", WATCHER, settings.REDIS_URL, key, "3.5"], stdout=subprocess.PIPE, text=True
        )
        assert watcher.stdout is not None and watcher.stdout.readline() == "watching\n"
        hold_the_gil(3)  # three TTLs with no thread of this process running
        misses = int(watcher.communicate(timeout=10)[0])
    assert misses == 0
    assert not store.client().exists(key)  # stopped: gone at once, not a TTL later


CHILD = textwrap.dedent(
    """
    import os, sys, time, django
    django.setup()
    from django.conf import settings
    settings.REDIS_URL, settings.PLAYGROUND_HEARTBEAT_INTERVAL_S = sys.argv[1], 0.2
    from playground.coord import liveness
    liveness.Heartbeat(["test:beacon:dies-with-its-worker"], 30.0).start()
    print(os.getpid(), flush=True)
    time.sleep(60)
    """
)


def test_the_keys_go_as_soon_as_their_worker_process_is_killed(settings: Any) -> None:
    """SIGKILL (the OOM killer, a crash): the pipe's end tells the beacon, which deletes what it
    kept, so the web side sees the loss at its next check, not a TTL (here 30 s) later."""
    worker = subprocess.Popen(
        [sys.executable, "-c", CHILD, settings.REDIS_URL],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "playground.settings"},
    )
    assert worker.stdout is not None
    worker.stdout.readline()
    r = store.client()
    assert r.exists("test:beacon:dies-with-its-worker")
    os.kill(worker.pid, signal.SIGKILL)  # no goodbye: only the pipe's end tells the beacon
    worker.wait()
    deadline = time.monotonic() + 2
    while r.exists("test:beacon:dies-with-its-worker") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not r.exists("test:beacon:dies-with-its-worker")


def test_a_beacon_whose_child_died_starts_another_that_keeps_every_key(settings: Any) -> None:
    settings.PLAYGROUND_HEARTBEAT_INTERVAL_S = 0.2
    beat = liveness.Heartbeat(["test:beacon:a", "test:beacon:b"], 1.0).start()
    try:
        child = beacon.get().child
        assert child is not None
        child.kill()
        child.wait()
        time.sleep(1.5)  # a TTL passes; the next beat's pulse finds the child gone and replaces it
        assert beacon.get().child is not child
        assert store.client().exists("test:beacon:a", "test:beacon:b") == 2
    finally:
        beat.stop()


def test_a_stopped_key_is_gone_when_stop_returns_even_beaten_every_10_ms(settings: Any) -> None:
    """The beacon deletes a dropped key and says so before `stop` returns: a delete made by the
    worker itself was undone by a beat already on its way (CI saw a stopped worker still listed)."""
    settings.PLAYGROUND_HEARTBEAT_INTERVAL_S = 0.01
    r = store.client()
    for attempt in range(200):
        beat = liveness.Heartbeat(["test:beacon:stopped"], 5.0).start()
        beat.stop()
        assert not r.exists("test:beacon:stopped"), attempt
