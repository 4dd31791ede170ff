"""The HTTP JSON endpoints: conversations CRUD, ownership, CSRF, errors as JSON."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from playground.coord import cancel
from playground.models import ChatTemplate, Conversation, Generation, LanguageModel, SamplingPreset
from playground.web import owners, submit

pytestmark = pytest.mark.django_db


def send(client: Client, method: str, path: str, body: Any = None, **extra: Any):
    data = json.dumps(body) if body is not None else ""
    return getattr(client, method)(path, data=data, content_type="application/json", **extra)


@pytest.fixture
def browser() -> Client:
    """A browser that loaded a page: it has its session and CSRF cookies."""
    client = Client(enforce_csrf_checks=True)
    client.get("/")
    return client


def owner_of(client: Client) -> str:
    """The owner id inside a test client's session (what its records are filed under)."""
    owner = owners.browser_owner(client.session)
    assert owner is not None
    return owner


def csrf(client: Client) -> dict[str, str]:
    client.get("/admin/login/")  # a page with a form sets the csrftoken cookie
    return {"HTTP_X_CSRFTOKEN": client.cookies["csrftoken"].value}


def test_models_and_presets_list_what_the_admin_configured(browser: Client, settings: Any, tmp_path) -> None:
    from inference.bundled_models import QWEN_CODER

    settings.PLAYGROUND_DATA_DIR = tmp_path  # Qwen not prepared here: SmolLM2 answers, and the list says why
    models = browser.get("/api/models/").json()
    assert [(m["name"], m["is_default"]) for m in models] == [
        ("Qwen2.5-Coder-0.5B-Instruct (bundled)", False),
        ("SmolLM2-135M-Instruct (bundled)", True),
    ]
    assert "is not prepared yet" in models[0]["unavailable"] and models[1]["unavailable"] is None
    assert "135M" in models[1]["summary"] and "中文" in models[0]["summary"]
    QWEN_CODER.downloaded_gguf(tmp_path).parent.mkdir(parents=True)
    with QWEN_CODER.downloaded_gguf(tmp_path).open("wb") as gguf:  # prepared (only its size is read here)
        gguf.truncate(QWEN_CODER.gguf_size)
    models = browser.get("/api/models/").json()
    assert [m["is_default"] for m in models] == [True, False] and models[0]["unavailable"] is None
    presets = {p["name"]: p for p in browser.get("/api/presets/").json()}
    assert presets["Greedy, no loops"]["is_default"] and presets["Balanced"]["params"]["top_p"] == 0.9
    no_loops = presets["Greedy, no loops"]["params"]
    assert (no_loops["repetition_penalty"], no_loops["penalize_prompt"]) == (1.15, False)
    assert presets["Beam search"]["params"]["num_beams"] == 4


def test_conversations_crud(browser: Client) -> None:
    headers = csrf(browser)
    preset = SamplingPreset.objects.get(name="Greedy")
    created = send(
        browser,
        "post",
        "/api/conversations/",
        {"title": "First", "system_prompt": "Be kind.", "preset_id": preset.pk},
        **headers,
    )
    assert created.status_code == 201
    conversation = created.json()
    assert (
        conversation["title"],
        conversation["system_prompt"],
        conversation["preset_id"],
        conversation["messages"],
    ) == ("First", "Be kind.", preset.pk, [])
    path = f"/api/conversations/{conversation['id']}/"

    send(browser, "post", "/api/conversations/", {"title": "Second"}, **headers)
    assert [c["title"] for c in browser.get("/api/conversations/").json()] == ["Second", "First"]

    patched = send(browser, "patch", path, {"title": "Renamed", "preset_id": None}, **headers)
    assert patched.status_code == 200
    assert (patched.json()["title"], patched.json()["preset_id"]) == ("Renamed", None)
    assert browser.get(path).json()["title"] == "Renamed"

    assert send(browser, "delete", path, **headers).status_code == 204
    assert browser.get(path).status_code == 404


def test_a_conversation_shows_its_active_messages_with_their_generation(browser: Client) -> None:
    queued = submit.generate(owner_of(browser), {"content": "Hi!"})
    messages = browser.get(f"/api/conversations/{queued.conversation_id}/").json()["messages"]
    assert [(m["id"], m["role"], m["content"]) for m in messages] == [
        (queued.user_message_id, "user", "Hi!"),
        (queued.message_id, "assistant", ""),
    ]
    assert (messages[1]["generation_id"], messages[1]["status"]) == (queued.generation_id, "queued")


def test_another_session_gets_404_for_my_records(browser: Client) -> None:
    queued = submit.generate(owner_of(browser), {"content": "Secret"})
    stranger = Client()
    stranger.get("/")
    assert stranger.get(f"/api/conversations/{queued.conversation_id}/").status_code == 404
    assert stranger.get(f"/api/generations/{queued.generation_id}/").status_code == 404
    assert send(stranger, "delete", f"/api/conversations/{queued.conversation_id}/").status_code == 404
    assert stranger.get("/api/conversations/").json() == []
    assert Conversation.objects.filter(pk=queued.conversation_id).exists()


def test_mutations_need_the_csrf_token(browser: Client) -> None:
    refused = send(browser, "post", "/api/conversations/", {"title": "x"})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "csrf_failed"
    assert not Conversation.objects.exists()


@pytest.mark.parametrize(
    "body, code, status",
    [
        ("not json", "bad_json", 400),
        ([1, 2], "bad_json", 400),
        ({"title": 5}, "invalid_field", 400),
        ({"model_id": 999}, "not_found", 404),
    ],
)
def test_bad_bodies_get_a_json_error(browser: Client, body: Any, code: str, status: int) -> None:
    headers = csrf(browser)
    data = body if isinstance(body, str) else json.dumps(body)
    response = browser.post("/api/conversations/", data=data, content_type="application/json", **headers)
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)


def test_an_unsupported_method_is_a_json_405(browser: Client) -> None:
    response = send(browser, "put", "/api/conversations/", {}, **csrf(browser))
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


def test_a_generation_whose_worker_died_reads_as_worker_lost(browser: Client) -> None:
    queued = submit.generate(owner_of(browser), {"content": "Hi!"})
    long_ago = timezone.now() - timedelta(minutes=1)
    Generation.objects.filter(pk=queued.generation_id).update(status="running", started_at=long_ago, text="Par")

    body = browser.get(f"/api/generations/{queued.generation_id}/").json()
    assert (body["status"], body["error"]["code"], body["text"]) == ("error", "worker_lost", "Par")
    conversation = browser.get(f"/api/conversations/{queued.conversation_id}/").json()
    assert conversation["messages"][1]["status"] == "error"


def test_deleting_a_conversation_stops_its_running_generation(browser: Client) -> None:
    queued = submit.generate(owner_of(browser), {"content": "Hi!"})
    response = send(browser, "delete", f"/api/conversations/{queued.conversation_id}/", **csrf(browser))
    assert response.status_code == 204
    assert cancel.is_cancel_requested(queued.generation_id)
    assert not Generation.objects.filter(pk=queued.generation_id).exists()


def test_models_say_which_system_prompt_their_template_adds(browser: Client) -> None:
    """The chat page's placeholder: what the bundled template sends when the user gives none,
    read from the template itself; an admin template without one gives null."""
    models = {m["name"]: m for m in browser.get("/api/models/").json()}
    bundled = models["SmolLM2-135M-Instruct (bundled)"]
    assert bundled["default_system_prompt"] == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    qwen = models["Qwen2.5-Coder-0.5B-Instruct (bundled)"]
    assert qwen["default_system_prompt"] == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

    plain = ChatTemplate.objects.create(
        name="plain", source="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    LanguageModel.objects.filter(pk=bundled["id"]).update(default_chat_template=plain)
    models = {m["name"]: m for m in browser.get("/api/models/").json()}
    assert models["SmolLM2-135M-Instruct (bundled)"]["default_system_prompt"] is None


def test_a_temperature_asks_for_sampling_under_the_greedy_default_preset(db) -> None:
    from playground.models import SamplingPreset
    from playground.web import submit

    assert SamplingPreset.default().greedy
    _, _, params = submit._choices({"overrides": {"temperature": 0.7}})
    assert not params.is_greedy and params.temperature == 0.7
    _, _, params = submit._choices({"overrides": {"temperature": 0.7, "greedy": True}})
    assert params.is_greedy
    _, _, params = submit._choices({"overrides": {"top_k": 5}})
    assert params.is_greedy  # the preset's own choice stands without a temperature
