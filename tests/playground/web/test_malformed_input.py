"""Malformed input gets a JSON 4xx with a stable code, never Django's HTML or debug page nor a
500 (issue 46, part 5): a browser Origin whose port is no number, JSON nested 100,000 deep, a
4 MB body, bytes that are not UTF-8, an unknown URL, a Host this server does not serve; with
DEBUG on (`make dev`, the live-stack tests) and off (`make run`). Also: no message a client
reads names an absolute path of the server, `/v1` refuses `max_tokens: 0` and states the
limit the docs state, DEBUG is off unless asked for, and daphne closes a socket it fails."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from inference.bundled_models import QWEN_CODER
from playground import protocol
from playground.models import Generation, LanguageModel
from playground.web import pages
from playground.worker import generation
from tests.playground.conftest import make_generation
from tests.playground.fake_engine import FakeEngine
from tests.playground.worker.test_generation import queue_chat

from .test_consumer import TIMEOUT_S, command, connect

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

REPO_DIR = Path(__file__).resolve().parents[3]
MODEL = "SmolLM2-135M-Instruct (bundled)"
QWEN_CODER_NAME = "Qwen2.5-Coder-0.5B-Instruct (bundled)"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
BAD_PORT_ORIGIN = "http://127.0.0.1:8000.evil.com"  # urlparse(...).port raises ValueError
DEEP = "[" * 100_000 + "]" * 100_000
# What Django's debug pages show and a client must never see.
DEBUG_PAGE_WORDS = ("Traceback", "REDIS_URL", "DATABASES", "SECRET_KEY", "playground.urls", "site-packages")
# An absolute path of two or more parts, as a message would spell it ("a/b" and URLs are not).
ABSOLUTE_PATH = re.compile(r"(?<![\w.~/:-])/[^\s'\"()]+/")


@pytest.fixture(params=[True, False], ids=["debug", "no-debug"])
def debug(request: pytest.FixtureRequest, settings: Any) -> bool:
    settings.DEBUG = request.param
    return request.param


@pytest.fixture
def client() -> Client:
    """Errors come back as responses, as a real client gets them, instead of raising here."""
    return Client(raise_request_exception=False)


@pytest.fixture
def browser(client: Client) -> Client:
    client.get("/")  # a page load: the session whose owner may create conversations
    return client


def post_json(client: Client, path: str, body: str | bytes, **extra: Any) -> Any:
    return client.post(path, body, content_type="application/json", **extra)


def json_error(response: Any, status: int, code: str) -> dict[str, Any]:
    """The response is `status` with the API's JSON error `code`, and nothing of a debug page."""
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json", response.content[:300]
    assert not any(word.encode() in response.content for word in DEBUG_PAGE_WORDS), response.content[:300]
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


# Origins --------------------------------------------------------------------------------


@pytest.mark.parametrize("method, path", [("get", "/v1/models"), ("post", "/v1/chat/completions")])
def test_an_origin_whose_port_is_no_number_is_a_json_403(client: Client, debug: bool, method: str, path: str) -> None:
    """It used to be a 500 (ValueError reading the port): with DEBUG, a page naming REDIS_URL."""
    body = {"data": json.dumps(CHAT), "content_type": "application/json"} if method == "post" else {}
    # `make run`'s own host: with none (the test client's default) no origin is allowed, and the
    # port was never read
    headers = {"Origin": BAD_PORT_ORIGIN, "Host": "127.0.0.1:8000"}
    response = getattr(client, method)(path, headers=headers, **body)
    error = json_error(response, 403, "origin_not_allowed")
    assert error["type"] == "invalid_request_error"  # /v1's OpenAI shape


async def test_a_socket_from_such_an_origin_is_refused(session_key: str) -> None:
    communicator = connect(session_key, origin=(b"origin", BAD_PORT_ORIGIN.encode()))
    connected, _ = await communicator.connect(timeout=TIMEOUT_S)
    assert not connected


# Bodies ---------------------------------------------------------------------------------


def test_json_nested_100000_deep_is_a_json_400_on_v1(client: Client, debug: bool) -> None:
    """It used to escape as a RecursionError: a 500 page."""
    error = json_error(post_json(client, "/v1/chat/completions", DEEP), 400, "nesting_too_deep")
    assert error["type"] == "invalid_request_error"


def test_json_nested_100000_deep_is_a_json_400_on_api(browser: Client, debug: bool) -> None:
    json_error(post_json(browser, "/api/conversations/", DEEP), 400, "nesting_too_deep")
    json_error(post_json(browser, "/api/conversations/", '{"title": ' + DEEP + "}"), 400, "nesting_too_deep")


def test_a_body_nested_past_the_bound_but_within_python_s_is_refused_too(browser: Client) -> None:
    body = '{"title": ' + "[" * 40 + "]" * 40 + "}"  # 41 levels: parses, and no real body nests so deep
    json_error(post_json(browser, "/api/conversations/", body), 400, "nesting_too_deep")
    assert post_json(browser, "/api/conversations/", '{"title": "fine"}').status_code == 201


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/conversations/"])
def test_a_4_mb_body_is_a_json_413(browser: Client, debug: bool, path: str) -> None:
    """It used to be Django's HTML "RequestDataTooBig" page (400)."""
    body = json.dumps({**CHAT, "padding": "x" * 4_000_000})
    error = json_error(post_json(browser, path, body), 413, "request_too_large")
    assert "4000" in error["message"] and "2621440" in error["message"]  # its size and the limit


def test_a_4_mb_form_body_is_a_json_413_before_the_csrf_check_reads_it(debug: bool) -> None:
    browser = Client(enforce_csrf_checks=True, raise_request_exception=False)
    browser.get("/admin/login/")  # the csrftoken cookie: the check then reads the form's token
    response = browser.post(
        "/api/conversations/", "title=" + "x" * 4_000_000, content_type="application/x-www-form-urlencoded"
    )
    json_error(response, 413, "request_too_large")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/conversations/"])
def test_a_body_that_is_not_utf8_is_a_json_400(browser: Client, debug: bool, path: str) -> None:
    body = json.dumps(CHAT).encode().replace(b"Hi", b"H\xff")
    error = json_error(post_json(browser, path, body), 400, "invalid_unicode")
    assert "0xff" in error["message"]


def test_a_lone_surrogate_in_a_v1_body_is_a_json_400(client: Client) -> None:
    body = json.dumps(CHAT).replace("Hi", "\\ud800")
    json_error(post_json(client, "/v1/chat/completions", body), 400, "invalid_unicode")
    assert not Generation.objects.exists()


def test_a_nul_character_in_a_v1_body_is_a_json_400(client: Client) -> None:
    body = json.dumps(CHAT).replace("Hi", "H\\u0000i")
    json_error(post_json(client, "/v1/chat/completions", body), 400, "invalid_unicode")
    assert not Generation.objects.exists()


async def test_a_binary_frame_that_is_not_utf8_is_invalid_unicode_and_the_socket_stays(session_key: str) -> None:
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    await ws.send_to(bytes_data=b'{"command": "generate", "content": "H\xff"}')
    refusal = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (refusal["type"], refusal["code"]) == ("error", "invalid_unicode"), refusal
    assert (await command(ws, "no-such-command"))["code"] == "unknown_command"
    await ws.disconnect()


# Unknown URLs, hosts, failures ----------------------------------------------------------


def test_an_unknown_v1_url_is_a_json_404(client: Client, debug: bool) -> None:
    """With DEBUG, Django's page listed every URL pattern."""
    error = json_error(client.get("/v1/nope"), 404, "not_found")
    assert error["message"] == "no API endpoint at /v1/nope"


def test_an_api_url_without_its_slash_is_a_json_404_that_says_so(browser: Client, debug: bool) -> None:
    """CommonMiddleware's APPEND_SLASH answered a POST without the slash with a RuntimeError
    under DEBUG (a 500 page) and a redirect without it (which loses the body)."""
    error = json_error(post_json(browser, "/api/conversations", '{"title": "x"}'), 404, "not_found")
    assert error["message"] == "no API endpoint at /api/conversations (its URL ends with a slash: /api/conversations/)"


def test_a_page_that_does_not_exist_is_a_plain_404(client: Client, settings: Any) -> None:
    settings.DEBUG = False
    response = client.get("/no/such/page/")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "Not found" in html and 'href="/"' in html  # the project's page, not Django's
    assert not any(word in html for word in (*DEBUG_PAGE_WORDS, "URLconf", "no/such/page"))


def test_a_failing_page_is_a_plain_500(client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.DEBUG = False
    monkeypatch.setattr(pages, "render", _fail)
    response = client.get("/learn/")
    assert response.status_code == 500
    html = response.content.decode()
    assert "Server error" in html and not any(word in html for word in (*DEBUG_PAGE_WORDS, "RuntimeError"))


def test_a_failing_api_view_is_a_json_500_even_with_debug(
    client: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.DEBUG = True
    monkeypatch.setattr(LanguageModel.objects, "filter", _fail)
    error = json_error(client.get("/api/models/"), 500, "internal_error")
    assert "secret" not in error["message"]


def test_a_host_this_server_does_not_serve_is_a_json_400(client: Client, debug: bool) -> None:
    """With DEBUG, Django's DisallowedHost page showed the settings."""
    json_error(client.get("/api/models/", HTTP_HOST="evil.example"), 400, "disallowed_host")
    json_error(client.get("/v1/models", HTTP_HOST="evil.example"), 400, "disallowed_host")


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a secret of the server's code")


# No server paths in what a client reads -------------------------------------------------


def test_a_preparation_failure_names_no_server_path(client: Client, settings: Any, tmp_path: Path) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path
    note = QWEN_CODER.unavailable_note(tmp_path)
    note.parent.mkdir(parents=True)
    note.write_text(f"[Errno 28] No space left on device: '{tmp_path}/models/part-3.whl' (pip in /usr/lib/x/pip)\n")
    listing = {m["name"]: m for m in client.get("/api/models/").json()}
    reason = listing[QWEN_CODER_NAME]["unavailable"]
    assert "'models/part-3.whl'" in reason and "(pip in pip)" in reason
    refused = post_json(client, "/v1/chat/completions", json.dumps({**CHAT, "model": QWEN_CODER_NAME}))
    error = json_error(refused, 503, "model_unavailable")
    for message in (reason, error["message"]):
        assert str(tmp_path) not in message and not ABSOLUTE_PATH.search(message), message


def test_a_model_load_failure_names_no_server_path(owner: str, settings: Any) -> None:
    queued = queue_chat(owner)
    missing = Path(settings.PLAYGROUND_DATA_DIR) / "models" / "gone" / "config.json"

    def broken_loader(model: Any) -> FakeEngine:
        raise OSError(f"[Errno 2] No such file or directory: '{missing}' (tokenizer in /opt/hf/cache/tok.json)")

    events: list[dict[str, Any]] = []
    generation.run_generation(queued.generation_id, "w", load_engine=broken_loader, send=events.append)
    assert [(e["type"], e["code"]) for e in events] == [("generation.error", "model_unavailable")]
    saved = Generation.objects.get(pk=queued.generation_id).error_message
    for message in (events[0]["message"], saved):
        assert "'models/gone/config.json'" in message and "(tokenizer in tok.json)" in message, message
        assert not ABSOLUTE_PATH.search(message), message


def test_a_saved_error_is_read_back_without_server_paths(client: Client, browser_session: Any) -> None:
    """A row ended in the web process (`submit.fail`: the task could not be queued) or saved before
    this rule keeps the full message; the API shows it without the path."""
    row = make_generation(
        browser_session.owner,
        status=Generation.Status.ERROR,
        error_code="internal_error",
        error_message="the task could not be queued: Error 2 connecting to unix socket: /var/run/redis/redis.sock.",
    )
    client.cookies["sessionid"] = browser_session.session_key
    error = client.get(f"/api/generations/{row.pk}/").json()["error"]
    assert error == {
        "code": "internal_error",
        "message": "the task could not be queued: Error 2 connecting to unix socket: redis.sock.",
    }


def test_a_workers_model_error_names_no_server_path(settings: Any) -> None:
    """The `worker.model` event every page's socket gets when a worker's model load fails."""
    config = Path(settings.PLAYGROUND_DATA_DIR) / "models" / "m" / "config.json"
    event = protocol.worker_model(
        "gpu@host", "error", 1, "m", 5.0, error=f"OSError: no file {config}, see /srv/x/y.log."
    )
    assert event["error"] == "OSError: no file models/m/config.json, see y.log."


def test_an_architecture_card_names_no_server_path(client: Client, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()  # a folder without config.json
    empty = LanguageModel.objects.create(name="empty", source=str(tmp_path / "empty"))
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    bad = LanguageModel.objects.create(name="bad", source=str(tmp_path / "bad"))
    for model in (empty, bad):
        error = json_error(client.get(f"/api/models/{model.pk}/architecture/"), 400, "model_unavailable")
        assert str(tmp_path) not in error["message"] and not ABSOLUTE_PATH.search(error["message"]), error


# max_tokens -----------------------------------------------------------------------------


def test_v1_refuses_max_tokens_0_on_a_chat_naming_the_field(client: Client) -> None:
    """A chat took `max_tokens: 0` (only legacy completions score a prompt with it) and answered
    with the preset's length; OpenAI requires at least 1."""
    for field, value in [("max_tokens", 0), ("max_completion_tokens", 0), ("max_tokens", -1)]:
        body = json.dumps({**CHAT, field: value})
        error = json_error(post_json(client, "/v1/chat/completions", body), 400, "invalid_value")
        assert error["param"] == field and error["message"].startswith(f"{field}={value} must be between 1 and ")
    assert not Generation.objects.exists()


@pytest.mark.parametrize("value", [2049, 2_000_000])
def test_v1_states_the_limit_the_docs_state(client: Client, settings: Any, value: int) -> None:
    settings.PLAYGROUND_MAX_NEW_TOKENS = 2048
    docs = (REPO_DIR / "docs" / "openai-api.md").read_text()
    assert "| `max_tokens` | `PLAYGROUND_MAX_NEW_TOKENS` (2048) |" in docs
    for path, body in [
        ("/v1/chat/completions", {**CHAT, "max_tokens": value}),
        ("/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": value}),
    ]:
        error = json_error(post_json(client, path, json.dumps(body)), 400, "invalid_value")
        assert error["param"] == "max_tokens" and error["message"] == f"max_tokens={value} must be between 1 and 2048"
    assert not Generation.objects.exists()


# DEBUG, static files, daphne ------------------------------------------------------------


def test_debug_is_off_unless_asked_for() -> None:
    """`make run` serves with DEBUG off; `DEBUG=1` (`make dev`) turns it on."""
    probe = "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)"
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"} | {"DJANGO_SETTINGS_MODULE": "playground.settings"}
    for extra, expected in [({}, "False"), ({"DEBUG": "1"}, "True"), ({"DEBUG": "0"}, "False")]:
        result = subprocess.run(
            [sys.executable, "-c", probe], cwd=REPO_DIR, env=env | extra, capture_output=True, text=True, timeout=120
        )
        assert result.stdout.strip().splitlines()[-1:] == [expected], result.stderr[-2000:]


def prepare_runs(debug: str | None, tmp_path: Path) -> list[str]:
    """The commands `make prepare` (before `make run`) runs, with every tool stubbed by `echo`."""
    stamp = tmp_path / "installed"
    stamp.touch()  # the requirements count as installed: nothing is installed
    stubs = [f"PY={shutil.which('true')}", f"VENV={tmp_path}", f"RUN_STAMP={stamp}", "PIP=false", "MANAGE=echo manage"]
    env = {k: v for k, v in os.environ.items() if k != "DEBUG"} | ({"DEBUG": debug} if debug is not None else {})
    result = subprocess.run(
        ["make", "-s", "prepare", *stubs], cwd=REPO_DIR, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_collects_static_files_unless_debug_is_on_and_they_are_served(settings: Any, tmp_path: Path) -> None:
    """With DEBUG off (the default now) whitenoise serves collectstatic's copy, so `make run`'s
    `prepare` must make it; it used to run only for an explicit DEBUG=0."""
    collects = "manage collectstatic --noinput -v 0"
    assert [collects in prepare_runs(debug, tmp_path) for debug in (None, "0", "1", "true")] == [
        True,
        True,
        False,
        False,
    ]
    settings.DEBUG = False
    settings.STATIC_ROOT = tmp_path / "static"
    settings.WHITENOISE_USE_FINDERS = settings.WHITENOISE_AUTOREFRESH = False  # the copy only
    call_command("collectstatic", interactive=False, verbosity=0)
    response = Client().get("/static/css/app.css")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == (REPO_DIR / "static" / "css" / "app.css").read_bytes()


def test_daphne_closes_a_socket_it_fails_with_its_code() -> None:
    """autobahn fails a connection on a text frame that is not UTF-8 (1007) or one over daphne's
    size limits (1009); its server factory's default dropped the TCP connection instead, with no
    close frame (tests/system/test_malformed_live.py sends such frames to a real daphne)."""
    from daphne import server

    import playground.asgi  # what daphne's command line imports before it starts its server

    playground.asgi.close_failing_sockets()  # a second call wraps nothing twice
    factory = server.WebSocketFactory(None, server="daphne")
    factory.setProtocolOptions(maxMessagePayloadSize=16 * 1024 * 1024)  # as daphne's Server.run does
    assert factory.failByDrop is False and factory.utf8validateIncoming is True
    assert server.WebSocketFactory.__mro__[1].__name__ == "WebSocketFactory"  # wrapped once
