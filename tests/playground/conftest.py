"""Fixtures for the app's tests: the in-memory channel layer, a private Redis for the
flags (`redis_url` from tests/conftest.py), browser sessions with their owners, and records."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.utils import translation

from playground.coord import cancel, store
from playground.models import Generation, LanguageModel
from playground.web import owners
from tests.playground.sent_tasks import on_task


@pytest.fixture(autouse=True)
def app_settings(settings: Any, redis_url: str) -> Iterator[Any]:
    """The in-memory channel layer (safe for the worker thread's sends: `channel_layer`); the
    flags go to an empty private Redis; the site's own language (a test that activated Chinese
    in this thread must not change the next one's messages)."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "tests.playground.channel_layer.ThreadSafeInMemoryChannelLayer"}}
    settings.REDIS_URL = redis_url
    store.client().flushdb()
    cancel._cancelled_here.clear()  # a worker's own stops: ids repeat from test to test
    translation.deactivate()
    yield settings
    translation.deactivate()


@dataclass(frozen=True)
class Browser:
    """A browser that loaded a page: its live session (the `sessionid` cookie) and the owner id
    kept inside it (what its records are filed under)."""

    session_key: str
    owner: str

    @property
    def page_token(self) -> str:
        return owners.page_token(self.owner)


def new_browser() -> Browser:
    session = SessionStore()
    owner = session[owners.OWNER_FIELD] = owners.new_browser_owner()
    session.create()
    return Browser(session.session_key, owner)


@pytest.fixture
def browser_session(db: None) -> Browser:
    return new_browser()


@pytest.fixture
def session_key(browser_session: Browser) -> str:
    return browser_session.session_key


@pytest.fixture
def owner(browser_session: Browser) -> str:
    return browser_session.owner


@pytest.fixture
def bundled_model(db: None) -> LanguageModel:
    """The bundled SmolLM2 the 0002 data migration ships (0011 makes Qwen2.5-Coder the default)."""
    return LanguageModel.objects.get(source="bundled")


def make_generation(owner: str, **fields: Any) -> Generation:
    fields.setdefault("model", LanguageModel.default())
    fields.setdefault("params", {"max_new_tokens": 8})
    return Generation.objects.create(owner=owner, **fields)


@pytest.fixture
def queued_ids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The generations the consumer enqueues (their ids), instead of sending them to a broker."""
    ids: list[int] = []
    on_task(monkeypatch, "run_generation", apply_async=lambda args, **options: ids.append(args[0]))
    return ids
