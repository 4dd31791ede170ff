"""The Celery worker command, one definition for `make run`, the tests and the docs.

A worker process holds one model and serves many generations at once: its Celery pool is
`PLAYGROUND_WORKER_SLOTS` threads (default 16), each following one generation, all feeding
the one engine loop thread that batches them (playground/worker/serve_loop.py).
"""

from __future__ import annotations

import os
import sys

DEFAULT_SLOTS = 16
# Celery's gossip, mingle and event heartbeats are not used here (liveness has its own keys), and
# after a lost broker connection they fail to restart (AttributeError in the Gossip step) and can
# leave the worker connected but consuming nothing (celery/celery#8030): a worker without them
# reconnects to a restarted Redis and goes on.
RECONNECT_OPTIONS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


def worker_slots() -> int:
    value = os.environ.get("PLAYGROUND_WORKER_SLOTS", "").strip()
    return int(value) if value else DEFAULT_SLOTS


def worker_argv(queues: str, name: str, python: str = sys.executable) -> list[str]:
    return [
        python,
        "-m",
        "celery",
        "-A",
        "playground",
        "worker",
        "-Q",
        queues,
        "-P",
        "threads",
        "--concurrency",
        str(worker_slots()),
        "-n",
        name,
        *RECONNECT_OPTIONS,
        "--loglevel=info",
    ]
