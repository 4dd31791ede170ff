"""The Redis connection for the small shared flags (stop requests, heartbeats), and what
losing Redis looks like.

Owns: one client per `settings.REDIS_URL` (keyed by URL so a changed setting, e.g. in
tests, gets its own); `OUTAGE_ERRORS`, the exceptions that mean Redis (the flags, the channel
layer or the Celery broker, one server) cannot be reached, and the message a generation ends
with then. Must not know: what the keys mean (see cancel.py, liveness.py).
"""

from __future__ import annotations

import kombu.exceptions
import redis
from django.conf import settings

# redis-py's errors (the flags, channels_redis), the socket's own (a refused or reset
# connection), and kombu's for a task that cannot be sent to the broker.
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (redis.RedisError, OSError, kombu.exceptions.OperationalError)
OUTAGE_MESSAGE = (
    "the server lost its connection to Redis (its message broker), so this generation was stopped; "
    "the answer so far was kept. Try again in a moment."
)

_clients: dict[str, redis.Redis] = {}


def client() -> redis.Redis:
    url = settings.REDIS_URL
    if url not in _clients:
        _clients[url] = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    return _clients[url]
