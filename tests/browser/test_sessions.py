"""Session fixation in a real browser: a key another origin planted in the cookie jar while the
chat page is open reaches the page's socket, which is refused (`session_changed`); the page
reloads, the reload moves the planted session to a new key, and whoever planted it reads nothing
the victim writes afterwards."""

from __future__ import annotations

from .conftest import WAIT_MS
from .ui import wait_for_events

KEEP_SOCKETS = """
window.__sockets = [];
const RecordingWebSocket = window.WebSocket;
window.WebSocket = class extends RecordingWebSocket {
  constructor(...args) { super(...args); window.__sockets.push(this); }
};
"""


def session_key(context) -> str:
    return next(c["value"] for c in context.cookies() if c["name"] == "sessionid")


def test_a_cookie_planted_under_an_open_page_makes_it_reload_and_the_planter_reads_nothing(page, chromium, live_stack):
    attacker = chromium.new_context(base_url=live_stack.base_url)
    try:
        attacker.new_page().goto("/")
        planted = session_key(attacker)

        frames: list[str] = []  # every socket's, across the reload
        page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(str(payload))))
        page.context.add_init_script(KEEP_SOCKETS)
        page.goto("/")
        page.wait_for_selector("#conn[data-state=open]", timeout=WAIT_MS)
        page_token = page.get_attribute('meta[name="page-token"]', "content")
        assert page_token and session_key(page.context) != planted

        # Another origin's Set-Cookie, then the socket reconnects (a network blip) with it.
        page.context.add_cookies([{"name": "sessionid", "value": planted, "url": live_stack.base_url}])
        with page.expect_navigation(timeout=WAIT_MS):
            page.evaluate("() => window.__sockets.at(-1).close()")
        page.wait_for_selector("#conn[data-state=open]", timeout=WAIT_MS)
        assert any('"session_changed"' in frame for frame in frames)
        assert session_key(page.context) != planted  # the reload moved the planted session to a new key

        page.fill("#prompt-input", "A secret only I should see.")
        page.press("#prompt-input", "Enter")
        wait_for_events(page, "generation.queued")
        response = attacker.request.get("/api/conversations/")
        assert response.ok and response.json() == []  # the planted key died with the rotation
    finally:
        attacker.close()
