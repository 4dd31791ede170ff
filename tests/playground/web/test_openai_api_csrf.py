"""`/v1/` is not a CSRF target: a page of another origin (another port of this host included)
cannot run a generation through a visitor's browser, whatever its request looks like."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import AsyncClient

from playground import dispatch
from playground.models import Generation
from playground.worker import generation
from tests.playground.fake_engine import FakeEngine
from tests.playground.sent_tasks import on_task

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

BODY = json.dumps({"model": "SmolLM2-135M-Instruct (bundled)", "prompt": "Hi", "max_tokens": 1})


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sent: list[int] = []
    # every task, whatever its name: nothing may reach a worker
    monkeypatch.setattr(dispatch.app, "send_task", lambda name, args=(), **options: sent.append(args[0]))
    return sent


async def post(content_type: str, **headers: str) -> Any:
    return await AsyncClient().post("/v1/completions", BODY, content_type=content_type, headers=headers)


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
@pytest.mark.parametrize("page", ["http://testserver:9999", "https://testserver", "http://evil.example", "null"])
async def test_a_cross_origin_simple_request_is_refused(content_type: str, page: str, no_broker: list[int]) -> None:
    """What `fetch(url, {method: "POST", mode: "no-cors", body})` from another page sends."""
    response = await post(content_type, Origin=page)
    assert (response.status_code, response.json()["error"]["code"]) == (403, "origin_not_allowed")
    assert no_broker == [] and not await Generation.objects.aexists()


async def test_a_foreign_page_is_refused_even_with_json_and_a_key(no_broker: list[int]) -> None:
    response = await post("application/json", Origin="http://127.0.0.1:9999", Authorization="Bearer pg-whatever")
    assert (response.status_code, response.json()["error"]["code"]) == (403, "origin_not_allowed")
    models = await AsyncClient().get("/v1/models", headers={"Origin": "http://127.0.0.1:9999"})
    assert models.status_code == 403
    assert no_broker == []


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_not_declared_json_is_refused(content_type: str, no_broker: list[int]) -> None:
    response = await post(content_type)  # no Origin: a script, e.g. curl without -H
    body = response.json()["error"]
    assert (response.status_code, body["code"]) == (415, "unsupported_media_type")
    assert "Content-Type: application/json" in body["message"]
    assert no_broker == [] and not await Generation.objects.aexists()


@pytest.mark.parametrize("headers", [{}, {"Origin": "http://testserver"}])
async def test_json_from_a_script_or_this_sites_own_page_is_served(
    headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeEngine("Hi you")
    on_task(
        monkeypatch,
        "run_generation",
        apply_async=lambda args, **options: generation.run_generation(args[0], "eager", load_engine=lambda model: fake),
    )
    response = await post("application/json; charset=utf-8", **headers)
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["text"] == "H"  # max_tokens 1 of the fake "Hi you"
