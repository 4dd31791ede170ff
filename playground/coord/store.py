"""The Redis connection for the small shared flags (stop requests, heartbeats).

Owns: one client per `settings.REDIS_URL` (keyed by URL so a changed setting, e.g. in
tests, gets its own). Must not know: what the keys mean (see cancel.py, liveness.py).
"""

from __future__ import annotations

import redis
from django.conf import settings

_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return _clients[url]
