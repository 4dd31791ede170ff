"""The admin never shows owner ids (it names API keys, and hashes a browser's); presets are
checked against the server's limits with every bad value reported at once; the API bounds titles."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from playground.models import ApiKey, Conversation, Generation, LanguageModel, SamplingPreset
from playground.web import owners
from tests.playground.web.test_api import csrf, send

from .test_admin import PRESET_ADD_URL, preset_form

pytestmark = pytest.mark.django_db

OWNER = "browser:" + "k" * 32


@pytest.fixture
def staff_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    return client


def test_the_admin_shows_a_hash_of_a_browsers_owner_never_the_id(staff_client: Client) -> None:
    conversation = Conversation.objects.create(owner=OWNER, title="secret-owner")
    generation = Generation.objects.create(
        owner=OWNER, model=LanguageModel.default(), conversation=conversation, params={}
    )
    digest = hashlib.sha256(OWNER.encode()).hexdigest()[:12]
    for path in [
        "/admin/playground/conversation/",
        f"/admin/playground/conversation/{conversation.pk}/change/",
        "/admin/playground/generation/",
        f"/admin/playground/generation/{generation.pk}/change/",
    ]:
        html = staff_client.get(path).content.decode()
        assert OWNER not in html, path
    assert (
        f"browser {digest}"
        in staff_client.get(f"/admin/playground/conversation/{conversation.pk}/change/").content.decode()
    )
    assert (
        f"browser {digest}"
        in staff_client.get(f"/admin/playground/generation/{generation.pk}/change/").content.decode()
    )
    # Searching by an owner id finds nothing: it is not something to look records up by.
    listing = staff_client.get("/admin/playground/conversation/", {"q": OWNER}).content.decode()
    assert "secret-owner" not in listing
    # Editing a conversation keeps its owner.
    conversation.refresh_from_db()
    assert conversation.owner == OWNER


def test_the_admin_names_the_api_client_that_owns_a_generation(staff_client: Client) -> None:
    key = ApiKey(name="grading-script")
    key.set_new_key()
    key.save()
    keyed = Generation.objects.create(owner=owners.api_key_owner(key.pk), model=LanguageModel.default(), params={})
    local = Generation.objects.create(owner=owners.LOCAL_API_OWNER, model=LanguageModel.default(), params={})
    assert (
        "API key &#x27;grading-script&#x27;"
        in staff_client.get(f"/admin/playground/generation/{keyed.pk}/change/").content.decode()
    )
    assert "local API client" in staff_client.get(f"/admin/playground/generation/{local.pk}/change/").content.decode()


def test_a_preset_over_the_servers_token_limit_is_refused(staff_client: Client, settings: Any) -> None:
    settings.PLAYGROUND_MAX_NEW_TOKENS = 2048
    response = staff_client.post(PRESET_ADD_URL, preset_form(max_new_tokens=100000))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "max_new_tokens=100000 exceeds this server's limit of 2048" in " ".join(errors["max_new_tokens"])
    assert not SamplingPreset.objects.filter(name="Mine").exists()


def test_an_invalid_preset_shows_every_error_at_once(staff_client: Client) -> None:
    response = staff_client.post(
        PRESET_ADD_URL,
        preset_form(top_p="1.5", temperature="-1", num_alternatives="999", stop='{"a": 1}', length_penalty="50"),
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert {"top_p", "temperature", "num_alternatives", "stop", "length_penalty"} <= set(errors), errors
    assert "top_p=1.5" in " ".join(errors["top_p"]) and "temperature=-1" in " ".join(errors["temperature"])


def test_a_valid_beam_preset_still_saves(staff_client: Client) -> None:
    response = staff_client.post(PRESET_ADD_URL, preset_form(num_beams="4", num_return_sequences="3"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert SamplingPreset.objects.get(name="Mine").to_sampling_params().num_return_sequences == 3


def test_the_api_refuses_a_title_longer_than_the_field() -> None:
    client = Client(enforce_csrf_checks=True)
    client.get("/")
    headers = csrf(client)
    response = send(client, "post", "/api/conversations/", {"title": "t" * 5000}, **headers)
    assert response.status_code == 400
    assert response.json()["error"] == {"code": "invalid_field", "message": "title has 5000 characters; at most 200"}
    assert not Conversation.objects.exists()
    created = send(client, "post", "/api/conversations/", {"title": "t" * 200}, **headers)
    assert created.status_code in (200, 201), created.content
    patched = send(client, "patch", f"/api/conversations/{created.json()['id']}/", {"title": "x" * 201}, **headers)
    assert patched.status_code == 400
    assert Conversation.objects.get().title == "t" * 200


HOSTILE_SOURCES = ["bundled; rm -rf /", "a" * 499, "/" + "a" * 498, "org/" + "b" * 300, "x" * 120]


@pytest.mark.parametrize("source", HOSTILE_SOURCES)
def test_a_source_that_is_no_model_is_a_form_error_not_a_500(staff_client: Client, source: str) -> None:
    response = staff_client.post(
        "/admin/playground/languagemodel/add/",
        {"name": "hostile", "source": source, "dtype": "auto", "device": "auto", "max_context": "", "is_enabled": "on"},
    )
    assert response.status_code == 200
    errors = " ".join(response.context["adminform"].form.errors["source"])
    assert "not a model folder" in errors or "cannot be a path" in errors or "does not exist" in errors, errors
    assert not LanguageModel.objects.filter(name="hostile").exists()


def test_a_record_with_a_source_that_is_no_model_does_not_break_the_model_list(client: Client) -> None:
    """Saved past the form (an older version, the shell): every visitor still gets the list."""
    for number, source in enumerate(HOSTILE_SOURCES):
        LanguageModel.objects.create(name=f"hostile-{number}", source=source)
    response = client.get("/api/models/")
    assert response.status_code == 200
    listed = {m["name"]: m["default_system_prompt"] for m in response.json()}
    assert all(listed[f"hostile-{number}"] is None for number in range(len(HOSTILE_SOURCES)))
    hostile = LanguageModel.objects.get(name="hostile-0")
    assert client.get(f"/api/models/{hostile.pk}/architecture/").status_code < 500
