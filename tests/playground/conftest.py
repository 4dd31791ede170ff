"""Fixtures for the app's tests: the in-memory channel layer, a private Redis for the
flags (`redis_url` from tests/conftest.py), sessions and records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.sessions.backends.db import SessionStore

from playground.coord import store
from playground.models import Generation, LanguageModel


@pytest.fixture(autouse=True)
def app_settings(settings: Any, redis_url: str) -> Iterator[Any]:
    """In-memory channel layer; the flags go to an empty private Redis."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    settings.REDIS_URL = redis_url
    store.client().flushdb()
    yield settings


@pytest.fixture
def session_key(db: None) -> str:
    session = SessionStore()
    session.create()
    return session.session_key


@pytest.fixture
def bundled_model(db: None) -> LanguageModel:
    """The bundled SmolLM2 the 0002 data migration ships (0011 makes Qwen2.5-Coder the default)."""
    return LanguageModel.objects.get(source="bundled")


def make_generation(session_key: str, **fields: Any) -> Generation:
    fields.setdefault("model", LanguageModel.default())
    fields.setdefault("params", {"max_new_tokens": 8})
    return Generation.objects.create(session_key=session_key, **fields)
