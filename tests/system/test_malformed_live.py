"""Malformed input against a real daphne serving as `make run` does now (DEBUG off): what only
the real server shows. A WebSocket text frame that is not UTF-8, and a frame over daphne's
16 MiB limit, are failed by autobahn before any application code runs; they used to drop the
TCP connection with no close frame (the client saw 1006) and now close with 1007 and 1009
(`playground/web/socket_failures.py`). The HTTP refusals come back as JSON through daphne too.

A web server alone (no worker: nothing here generates) on a migrated throw-away database."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from scripts.net import free_port, http_status
from scripts.processes import Service
from scripts.run import DAPHNE_OPTIONS, WEBSOCKET_LIMIT_BYTES
from tests.conftest import ARTIFACTS_DIR, REPO_DIR, run_prepare_step, stack_env, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@dataclass(frozen=True)
class Web:
    base_url: str
    ws_url: str


@pytest.fixture(scope="module")
def web(stack_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    env = stack_env(stack_redis_url, tmp_path_factory.mktemp("db") / "db.sqlite3") | {"DEBUG": "0"}
    run_prepare_step("migrate-debug-off", [sys.executable, "-m", "django", "migrate", "--noinput"], env)
    port = free_port()
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), *DAPHNE_OPTIONS]
    service = Service(
        "web-debug-off",
        [*argv, "playground.asgi:application"],
        env=env,
        cwd=REPO_DIR,
        log_path=ARTIFACTS_DIR / "web-debug-off.log",
    )
    try:
        service.start()
        base_url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_status(base_url + "/") == 200, service, "HTTP 200 on /")
        yield Web(base_url, f"ws://127.0.0.1:{port}/ws/generate/")
    finally:
        service.stop(grace_s=10.0)


def open_socket(web: Web) -> ClientConnection:
    return connect(web.ws_url, origin=web.base_url, open_timeout=30, max_size=None)


def close_code(ws: ClientConnection, timeout_s: float = 30) -> int | None:
    """The code of the close frame the server sent (None: the connection dropped without one)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=timeout_s)
    return closed.value.rcvd.code if closed.value.rcvd is not None else None


def still_serves(web: Web) -> None:
    with open_socket(web) as ws:
        ws.send(json.dumps({"command": "no-such-command"}))
        assert json.loads(ws.recv(timeout=30))["code"] == "unknown_command"


def test_a_text_frame_that_is_not_utf8_closes_the_socket_with_1007(web: Web) -> None:
    with open_socket(web) as ws:
        ws.send(b'{"command": "generate", "content": "H\xff"}', text=True)  # the bytes as they are
        assert close_code(ws) == 1007
    still_serves(web)


def test_a_frame_over_daphnes_limit_closes_the_socket_with_1009(web: Web) -> None:
    with open_socket(web) as ws:
        try:
            ws.send("x" * (WEBSOCKET_LIMIT_BYTES + 1024))
        except ConnectionClosed:  # the server may close while the frame is still going out
            pass
        assert close_code(ws) == 1009
    still_serves(web)


def request(web: Web, path: str, body: bytes | None = None, **headers: str) -> tuple[int, str, bytes]:
    call = urllib.request.Request(web.base_url + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(call, timeout=60) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def test_http_refusals_are_json_and_pages_plain_with_debug_off(web: Web) -> None:
    host = web.base_url.split("//", 1)[1]
    status, kind, body = request(web, "/v1/models", Origin=f"http://{host}.evil.com")
    assert (status, kind, json.loads(body)["error"]["code"]) == (403, "application/json", "origin_not_allowed")
    big = json.dumps({"model": "m", "messages": [], "padding": "x" * 4_000_000}).encode()
    status, kind, body = request(web, "/v1/chat/completions", big, **{"Content-Type": "application/json"})
    assert (status, kind, json.loads(body)["error"]["code"]) == (413, "application/json", "request_too_large")
    status, kind, body = request(web, "/v1/nope")
    assert (status, kind, json.loads(body)["error"]["code"]) == (404, "application/json", "not_found")
    status, kind, body = request(web, "/no/such/page/")
    assert (status, kind.split(";")[0]) == (404, "text/html")
    assert b"Not found" in body and b"Traceback" not in body and b"URLconf" not in body
    status, kind, css = request(web, "/static/css/app.css")  # whitenoise, with DEBUG off
    assert (status, kind.split(";")[0]) == (200, "text/css") and css
