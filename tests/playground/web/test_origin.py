"""Cross-site WebSocket hijacking: only a page of the socket's own origin (scheme, host and
port) or of PLAYGROUND_ALLOWED_ORIGINS may open it, cookie or not."""

from __future__ import annotations

from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from playground.asgi import application

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)


async def opens(host: str, origin: str | None, scheme: str = "ws", session_key: str | None = None) -> bool:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if session_key:
        headers.append((b"cookie", f"sessionid={session_key}".encode()))
    communicator = WebsocketCommunicator(application, "/ws/generate/", headers=headers)
    communicator.scope["scheme"] = scheme
    connected, _ = await communicator.connect(timeout=10)
    if connected:
        await communicator.send_json_to({"command": "nope"})
        assert (await communicator.receive_json_from(timeout=10))["code"] == "unknown_command"
        await communicator.disconnect()
    return connected


@pytest.mark.parametrize(
    "host, origin, scheme",
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000", "ws"),
        ("localhost:8000", "http://localhost:8000", "ws"),
        ("[::1]:8000", "http://[::1]:8000", "ws"),
        ("localhost", "http://localhost:80", "ws"),  # the default port, spelled or not
        ("127.0.0.1:8443", "https://127.0.0.1:8443", "wss"),
    ],
)
async def test_the_same_origin_page_opens_the_socket(session_key: str, host: str, origin: str, scheme: str) -> None:
    assert await opens(host, origin, scheme, session_key)


@pytest.mark.parametrize(
    "host, origin, scheme",
    [
        ("127.0.0.1:8000", "http://127.0.0.1:9999", "ws"),  # another port of the same host
        ("127.0.0.1:8000", "https://127.0.0.1:8000", "ws"),  # another scheme
        ("127.0.0.1:8443", "http://127.0.0.1:8443", "wss"),  # plain page, TLS socket
        ("127.0.0.1:8000", "http://localhost:8000", "ws"),  # another host name
        ("127.0.0.1:8000", "http://evil.example", "ws"),
        ("127.0.0.1:8000", "null", "ws"),  # a sandboxed iframe or a file: page
        ("127.0.0.1:8000", None, "ws"),
        ("evil.example", "http://evil.example", "ws"),  # DNS rebinding: the host is not allowed
    ],
)
async def test_a_page_of_another_origin_is_refused(
    session_key: str, host: str, origin: str | None, scheme: str
) -> None:
    assert not await opens(host, origin, scheme, session_key)


async def test_the_configured_allow_list_replaces_same_origin(session_key: str, settings: Any) -> None:
    settings.PLAYGROUND_ALLOWED_ORIGINS = ["https://chat.example"]
    assert await opens("127.0.0.1:8000", "https://chat.example", "ws", session_key)  # behind a TLS proxy
    assert await opens("127.0.0.1:8000", "https://chat.example:443", "ws", session_key)
    assert not await opens("127.0.0.1:8000", "http://chat.example", "ws", session_key)
    assert not await opens("127.0.0.1:8000", "https://chat.example:8443", "ws", session_key)
    assert not await opens("127.0.0.1:8000", "http://127.0.0.1:8000", "ws", session_key)
