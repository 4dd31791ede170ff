"""How daphne fails a WebSocket connection: with a close frame and its code, not a dropped TCP
connection.

autobahn, daphne's WebSocket layer, checks every text frame's UTF-8 as it arrives (before daphne
decodes the message for the consumer, which therefore never sees such a frame) and fails the
connection on invalid bytes (1007), on a message or frame over daphne's
`--websocket-max-message-size` / `--websocket-max-frame-size` (1009) and on a protocol violation
(1002). RFC 6455 (7.1.7, 8.1) has it send a Close frame with that code; but autobahn's server
factory defaults to `failByDrop=True`, which drops the TCP connection instead, and daphne has no
option for it: a client saw its socket vanish with no code (1006 on its side) and no reason.

Owns: that one factory option, set before daphne builds its factory (`close_failing_sockets`,
called when the ASGI application is built, which daphne's command line does before it starts
its server). Without daphne (another ASGI server) it does nothing.
"""

from __future__ import annotations

from typing import Any


def close_failing_sockets() -> None:
    """Makes the WebSocket factory daphne's server builds close a failing connection with its
    code (1007, 1009, 1002) instead of dropping it."""
    try:
        from daphne import server
    except ImportError:  # not served by daphne
        return
    if not getattr(server.WebSocketFactory, "closes_failing_sockets", False):
        server.WebSocketFactory = _closing(server.WebSocketFactory)


def _closing(factory: type) -> type:
    class ClosingWebSocketFactory(factory):  # type: ignore[misc, valid-type]
        closes_failing_sockets = True

        def resetProtocolOptions(self, *args: Any, **kwargs: Any) -> None:  # noqa: N802 (autobahn's name)
            super().resetProtocolOptions(*args, **kwargs)
            self.failByDrop = False  # daphne's setProtocolOptions call leaves it alone

    return ClosingWebSocketFactory
