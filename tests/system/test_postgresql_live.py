"""Concurrent writers on PostgreSQL: many streams saving their partial answers, the admin and API
keys, all at once, against the live stack's database. Runs only when the stack runs on
PostgreSQL (`DATABASE_URL` naming a server: `.ci/run`'s PostgreSQL run, scripts/test_postgres.sh);
on SQLite, the default, it is skipped (the other system tests cover that)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import REPO_DIR, LiveStack, django_shell, is_postgres_url

from .wsclient import BrowserTab, ends_request, receive_until, send, streamed_text

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not is_postgres_url(os.environ.get("DATABASE_URL", "")),
        reason="the live stack runs on SQLite (set DATABASE_URL to a PostgreSQL server)",
    ),
]

NUM_STREAMS = 8
NUM_ADMIN_KEYS = 4
NUM_COMMAND_KEYS = 2
# Long enough for several partial saves each (one a second), short enough for a 2-core box.
STREAM = {"max_new_tokens": 64, "greedy": True, "ignore_eos": True}
ADMIN_USER, ADMIN_PASSWORD = "pg-admin", "pg-admin-password-52"
KEY = re.compile(r"pg-[A-Za-z0-9_-]{32}")


@pytest.fixture(scope="module")
def postgres_stack(live_stack: LiveStack) -> LiveStack:
    assert is_postgres_url(live_stack.env["DATABASE_URL"]), live_stack.env["DATABASE_URL"]
    django_shell(
        "from django.contrib.auth.models import User; "
        f"User.objects.filter(username={ADMIN_USER!r}).exists() or "
        f"User.objects.create_superuser({ADMIN_USER!r}, 'pg@example.com', {ADMIN_PASSWORD!r}); print('ok')",
        live_stack.env,
    )
    return live_stack


class AdminSession:
    """A staff browser: logged in through the admin's own form (session + CSRF cookies)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.tab = BrowserTab(base_url, "")
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.tab.cookies))
        self.post("/admin/login/?next=/admin/", {"username": ADMIN_USER, "password": ADMIN_PASSWORD}, "/admin/login/")
        assert "sessionid" in self.tab.cookie_header(), "the admin login did not take"

    def csrf_token(self) -> str:
        return next(cookie.value for cookie in self.tab.cookies if cookie.name == "csrftoken")

    def post(self, path: str, fields: dict[str, str], form_path: str) -> str:
        """GET the form (for the CSRF cookie), POST it, follow the redirect; the final page's HTML."""
        status, _ = self.tab.get(form_path)
        assert status == 200, (form_path, status)
        body = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": self.csrf_token()}).encode()
        request = urllib.request.Request(self.base_url + path, data=body, headers={"Referer": self.base_url + path})
        with self.opener.open(request, timeout=60) as response:
            return response.read().decode()

    def add_api_key(self, name: str) -> str:
        add = "/admin/playground/apikey/add/"
        page = self.post(add, {"name": name, "is_active": "on"}, add)
        keys = KEY.findall(page)
        assert len(keys) == 1, page[-2000:]
        return keys[0]


def command_api_key(stack: LiveStack, name: str) -> str:
    """`manage.py create_api_key`, another process writing the same table."""
    result = subprocess.run(
        [sys.executable, "-m", "django", "create_api_key", name],
        cwd=REPO_DIR,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [key] = KEY.findall(result.stdout)
    return key


def stream(stack: LiveStack, index: int) -> tuple[int, str, list[dict[str, Any]]]:
    tab = BrowserTab(stack.base_url, stack.ws_url)
    assert tab.get("/")[0] == 200
    with tab.connect() as ws:
        send(ws, "generate", content=f"Count from {index} to {index + 40}, one number per line.", overrides=STREAM)
        events = receive_until(ws, ends_request)
    assert events[-1]["type"] == "generation.finished", events[-1]
    generation_id = next(e["generation_id"] for e in events if e["type"] == "generation.queued")
    return generation_id, streamed_text(events), events


def run_all(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Runs every job at once, each in its own thread; their results in order (or the first error)."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(index: int, job: Callable[[], Any]) -> None:
        try:
            results[index] = job()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=item, daemon=True) for item in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=400)
    if errors:
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads), "a job did not end"
    return results


def v1_models_status(base_url: str, key: str) -> int:
    request = urllib.request.Request(base_url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_streams_admin_and_api_keys_write_at_once_and_every_row_is_whole(postgres_stack: LiveStack) -> None:
    stack = postgres_stack
    jobs: list[Callable[[], Any]] = [lambda i=i: stream(stack, i) for i in range(NUM_STREAMS)]
    # One admin session each: the admin's "key created" message lives in the session, and two
    # requests of one session at once could each read the other's.
    jobs += [lambda i=i: AdminSession(stack.base_url).add_api_key(f"admin-key-{i}") for i in range(NUM_ADMIN_KEYS)]
    jobs += [lambda i=i: command_api_key(stack, f"command-key-{i}") for i in range(NUM_COMMAND_KEYS)]
    results = run_all(jobs)
    streams, keys = results[:NUM_STREAMS], results[NUM_STREAMS:]

    ids = [generation_id for generation_id, _, _ in streams]
    rows = json.loads(
        django_shell(
            "import json; from playground.models import Generation as G; print(json.dumps({g.id: "
            f"[g.status, g.text, g.num_generated_tokens] for g in G.objects.filter(id__in={ids!r})}}))",
            stack.env,
        )
    )
    for generation_id, text, events in streams:
        assert events[-1]["type"] == "generation.finished", events[-1]
        status, saved_text, num_tokens = rows[str(generation_id)]
        assert status == "finished" and saved_text == text == events[-1]["text"] != ""
        assert num_tokens == STREAM["max_new_tokens"]

    assert len(set(keys)) == NUM_ADMIN_KEYS + NUM_COMMAND_KEYS
    # Each key works, all at once (each use writes its last_used_at).
    assert run_all([lambda k=k: v1_models_status(stack.base_url, k) for k in keys]) == [200] * len(keys)
    names = django_shell(
        "from playground.models import ApiKey; "
        "print(sorted(k.name for k in ApiKey.objects.filter(last_used_at__isnull=False)))",
        stack.env,
    )
    expected = sorted(
        [f"admin-key-{i}" for i in range(NUM_ADMIN_KEYS)] + [f"command-key-{i}" for i in range(NUM_COMMAND_KEYS)]
    )
    assert names == repr(expected)
