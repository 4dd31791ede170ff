"""The Celery broker transport: kombu's Redis transport, with its channels able to close after
Redis is gone (settings.py `CELERY_BROKER_TRANSPORT`, for `redis://` URLs).

Owns: how a broker channel is torn down when its connection died. Must not know: tasks,
generations, Django.

Why (issue 46; docs/reliability.md, "losing Redis"): Redis killed while the worker runs a task
made the worker process exit. With `task_acks_late` the running task's message is delivered but
unacknowledged, and kombu keeps it on the channel to put back in the queue when the channel
closes. On a lost connection Celery's consumer (5.7, `on_connection_error_after_connected`) first
`collect()`s the connection and then `close()`s it:

1. `collect()` closes the default channel (the tasks'). kombu's `Channel.close()` starts by
   reading the reply of the BRPOP it has in flight; on a dead socket that read raises
   `ConnectionError`, and `close()` stops right there: the channel is not marked closed and
   still holds the message. The error is swallowed (`maybe_close_channel`); the transport's
   `close_connection` then stops at the remote-control channel, whose close fails too (it
   deletes its fanout queue), before it reaches the default channel again; and `collect()`
   detaches the transport from its connection (`transport.client = None`).
2. `close()` closes that default channel again. This time it gets as far as putting the message
   back, which needs a new Redis client, whose parameters are read from `transport.client`:
   `AttributeError: 'NoneType' object has no attribute 'hostname'` (`Channel._connparams`). An
   AttributeError is not a connection error, so the consumer does not retry: the worker stops
   with "Unrecoverable error" and `make run`'s supervisor starts a new process.

It takes both a task running and a BRPOP in flight: an idle worker has nothing to put back, and
a full one (every place taken) asks for no more work, so its step 1 completes. A kill while a
worker ran a generation with places to spare showed it. Here a channel whose in-flight BRPOP cannot be read any more
treats that reply as lost with the connection (it is) and goes on closing, so step 1 closes it
completely while the transport is still attached: it tries to put the message back (and, Redis
being gone, fails with a connection error, which is swallowed as before; a restarted Redis has
lost its queues anyway), and marks itself closed, so step 2 has nothing left to do. The consumer
then reconnects as it does when idle. Every other error still propagates.
"""

from __future__ import annotations

from queue import Empty

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    """A Redis channel whose `close()` survives a connection that died under its BRPOP."""

    def close(self) -> None:
        self._drop_pending_brpop()
        super().close()

    def _drop_pending_brpop(self) -> None:
        """Read the reply of the BRPOP in flight, if any, as kombu's `close()` does first; when the
        connection is dead that reply is gone, and closing must not stop there (module docstring)."""
        if not self._in_poll:
            return
        try:
            self._brpop_read()  # delivers a message that did arrive; clears `_in_poll` in any case
        except Empty:
            pass
        except self.connection_errors:
            pass  # `_brpop_read` has disconnected the client; the rest of `close()` still runs


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with `Channel` above (`CELERY_BROKER_TRANSPORT`)."""

    Channel = Channel
