"""The WebSocket contract's refusals, over the real ASGI server (docs/protocol.md)."""

from __future__ import annotations

import pytest
from websockets.exceptions import InvalidStatus

from .wsclient import BrowserTab, receive, send

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_bad_json_is_refused_and_the_socket_stays_usable(tab: BrowserTab) -> None:
    with tab.connect() as ws:
        ws.send("{this is not json")
        refusal = receive(ws, timeout_s=30)
        assert (refusal["type"], refusal["code"]) == ("error", "bad_json"), refusal

        send(ws, "no-such-command", request_id="r2")
        refusal = receive(ws, timeout_s=30)
        assert (refusal["type"], refusal["code"], refusal["request_id"]) == ("error", "unknown_command", "r2")


def test_a_message_over_the_limit_in_one_7_mib_frame_is_refused_and_the_socket_stays_open(tab: BrowserTab) -> None:
    """A client that does not fragment sends a message as one frame: past daphne's default frame
    limit (1 MiB) the connection used to drop without a close frame. 7 MiB is over the server's
    own message limit (about 5.8 MiB by default) and under daphne's (16 MiB)."""
    with tab.connect() as ws:
        ws.send('{"command": "generate", "content": "' + "x" * (7 * 1024 * 1024) + '"}')
        refusal = receive(ws, timeout_s=60)
        assert (refusal["type"], refusal["code"]) == ("error", "message_too_large"), refusal
        send(ws, "no-such-command", request_id="r2")
        assert receive(ws, timeout_s=30)["code"] == "unknown_command"


def test_a_foreign_origin_cannot_open_the_socket(tab: BrowserTab) -> None:
    with pytest.raises(InvalidStatus) as refused:
        tab.connect(origin="http://evil.example")
    assert refused.value.response.status_code == 403


@pytest.mark.parametrize("scheme, port_offset", [("http", 1), ("https", 0)])
def test_a_page_on_another_port_or_scheme_of_the_host_cannot_open_the_socket(
    tab: BrowserTab, scheme: str, port_offset: int
) -> None:
    """Cross-site WebSocket hijacking: the session cookie would ride along from such a page."""
    host, port = tab.base_url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
    tab.get("/")  # the session cookie exists, as in the attacked browser
    with pytest.raises(InvalidStatus) as refused:
        tab.connect(origin=f"{scheme}://{host}:{int(port) + port_offset}")
    assert refused.value.response.status_code == 403
