"""Migration 0010: records move from the raw session cookie to owner ids, and a browser that had
conversations before keeps them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone

from playground.web import owners

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

BEFORE = [("playground", "0009_weight_precision_help_names_q4_k")]
AFTER = [("playground", "0010_owner")]


@pytest.fixture(autouse=True)
def latest_schema_after(transactional_db: None) -> Iterator[None]:
    """The tests after this one need every migration: the database goes back to the latest."""
    yield
    migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


def migrate(targets: list[tuple[str, str]]):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_rows_move_to_owner_ids_and_a_live_session_keeps_its_conversations() -> None:
    apps = migrate(BEFORE)
    conversation_model = apps.get_model("playground", "Conversation")
    generation_model = apps.get_model("playground", "Generation")
    live = SessionStore()
    live["_something_else"] = 1
    live.create()
    expired = SessionStore()
    expired.create()
    Session.objects.filter(session_key=expired.session_key).update(expire_date=timezone.now() - timedelta(days=1))
    olds = [live.session_key, expired.session_key, "api-key-7", "api-local", "forged-by-someone"]
    ids = {old: conversation_model.objects.create(session_key=old, title=old).pk for old in olds}
    generation_model.objects.create(session_key="api-key-7", params={})

    apps = migrate(AFTER)
    conversation_model = apps.get_model("playground", "Conversation")
    owner_of = {old: conversation_model.objects.get(pk=pk).owner for old, pk in ids.items()}
    assert owner_of[live.session_key] == "browser:" + live.session_key
    assert owner_of["api-key-7"] == owners.api_key_owner(7)
    assert owner_of["api-local"] == owners.LOCAL_API_OWNER
    for old in (expired.session_key, "forged-by-someone"):  # no live session holds these
        assert owner_of[old].startswith("unowned:")
    assert apps.get_model("playground", "Generation").objects.get().owner == owners.api_key_owner(7)
    migrated = SessionStore(live.session_key)
    assert (migrated[owners.OWNER_FIELD], migrated["_something_else"]) == ("browser:" + live.session_key, 1)

    # The browser that held that cookie still sees its conversation (under its rotated key).
    browser = Client()
    browser.cookies["sessionid"] = live.session_key
    browser.get("/")
    assert [c["title"] for c in browser.get("/api/conversations/").json()] == [live.session_key]
