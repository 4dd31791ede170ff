"""A scripted browser tab for the end-to-end tests: cookies, JSON API calls, the WebSocket.

Owns: speaking HTTP + WebSocket to a running server the way the page does (session and CSRF
cookies from the first page load, same-origin Origin header) and reading event streams.
Must not know: app internals (only docs/protocol.md).
"""

from __future__ import annotations

import http.cookiejar
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from websockets.sync.client import ClientConnection, connect

TERMINAL_TYPES = ("generation.finished", "generation.error")
GENERATION_TIMEOUT_S = 180  # the worker's first generation also loads the model


class BrowserTab:
    """One browser's cookies against one server; `connect()` opens its generation socket."""

    def __init__(self, base_url: str, ws_url: str) -> None:
        self.base_url = base_url
        self.ws_url = ws_url
        self.cookies = http.cookiejar.CookieJar()
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with self._opener.open(self.base_url + path, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def get_json(self, path: str) -> tuple[int, Any]:
        status, body = self.get(path)
        return status, json.loads(body)

    def cookie_header(self) -> str:
        return "; ".join(f"{cookie.name}={cookie.value}" for cookie in self.cookies)

    def connect(self, origin: str | None = None) -> ClientConnection:
        return connect(
            self.ws_url,
            origin=origin or self.base_url,
            additional_headers={"Cookie": self.cookie_header()},
            open_timeout=30,
        )


def send(ws: ClientConnection, command: str, **fields: Any) -> None:
    ws.send(json.dumps({"command": command, **fields}))


def receive(ws: ClientConnection, timeout_s: float = GENERATION_TIMEOUT_S) -> dict[str, Any]:
    return json.loads(ws.recv(timeout=timeout_s))


def receive_until(
    ws: ClientConnection, is_done: Callable[[dict[str, Any]], bool], timeout_s: float = GENERATION_TIMEOUT_S
) -> list[dict[str, Any]]:
    """Events up to and including the first for which `is_done(event)` holds."""
    deadline = time.monotonic() + timeout_s
    events: list[dict[str, Any]] = []
    while not events or not is_done(events[-1]):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"gave up after {timeout_s}s; got {[e.get('type') for e in events]}")
        events.append(receive(ws, remaining))
    return events


def ends_request(event: dict[str, Any]) -> bool:
    """A generation's terminal event, or the refusal of a command (nothing was started)."""
    return event.get("type") in (*TERMINAL_TYPES, "error")


def steps_of(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [step for event in events if event["type"] == "generation.tokens" for step in event["steps"]]


def streamed_text(events: list[dict[str, Any]]) -> str:
    return "".join(step["text_delta"] for step in steps_of(events))
