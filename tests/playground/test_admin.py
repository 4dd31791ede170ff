"""The admin: staff only, and bad values refused with a message that names them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.test import Client

from playground.models import ChatTemplate, Generation, LanguageModel, SamplingPreset
from playground.web import owners

pytestmark = pytest.mark.django_db

PRESET_ADD_URL = "/admin/playground/samplingpreset/add/"


@pytest.fixture
def staff_client(client: Client) -> Client:
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    return client


def preset_form(**changes: Any) -> dict[str, Any]:
    """The add form as a browser posts it (unchecked checkboxes are left out)."""
    data = {
        "name": "Mine",
        "description": "",
        "max_new_tokens": 64,
        "temperature": 0.8,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "seed": "",
        "num_alternatives": 10,
        "stop": "[]",
        "num_beams": 1,
        "length_penalty": 1.0,
        "num_return_sequences": 1,
        "use_kv_cache": "on",
        "use_prefix_cache": "on",
    }
    data.update(changes)
    return data


def test_anonymous_users_are_sent_to_the_login_page(client: Client) -> None:
    response = client.get(PRESET_ADD_URL)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_non_staff_users_cannot_use_the_admin(client: Client) -> None:
    client.force_login(User.objects.create_user("visitor", password="pw"))
    assert client.get(PRESET_ADD_URL).status_code == 302


def test_staff_adds_a_preset_that_converts_to_sampling_params(staff_client: Client) -> None:
    response = staff_client.post(PRESET_ADD_URL, preset_form(top_k=40, stop='["\\n\\n"]', seed="7"))
    assert response.status_code == 302, response.content.decode()[:2000]
    params = SamplingPreset.objects.get(name="Mine").to_sampling_params()
    assert (params.temperature, params.top_k, params.stop, params.seed) == (0.8, 40, ("\n\n",), 7)


@pytest.mark.parametrize(
    "field, value, fragment",
    [
        ("top_p", "1.5", "top_p=1.5"),
        ("temperature", "-1", "temperature=-1"),
        ("num_return_sequences", "3", "num_return_sequences=3"),
        ("stop", '{"a": 1}', "must be a list of strings"),
    ],
)
def test_an_invalid_preset_is_refused_with_the_value_named(
    staff_client: Client, field: str, value: str, fragment: str
) -> None:
    response = staff_client.post(PRESET_ADD_URL, preset_form(**{field: value}))
    assert response.status_code == 200  # the form again, with errors
    errors = response.context["adminform"].form.errors
    assert fragment in " ".join(errors[field]), errors
    assert not SamplingPreset.objects.filter(name="Mine").exists()


def test_a_new_default_preset_replaces_the_old_default(staff_client: Client) -> None:
    old_default = SamplingPreset.default()
    response = staff_client.post(PRESET_ADD_URL, preset_form(is_default="on"))
    assert response.status_code == 302
    assert SamplingPreset.default().name == "Mine"
    old_default.refresh_from_db()
    assert not old_default.is_default


def test_a_chat_template_with_a_syntax_error_is_refused(staff_client: Client) -> None:
    response = staff_client.post(
        "/admin/playground/chattemplate/add/",
        {"name": "broken", "description": "", "source": "{% for m in messages %}{{ m"},
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["source"]
    assert not ChatTemplate.objects.filter(name="broken").exists()


def test_the_chat_template_page_previews_the_rendered_sample(staff_client: Client) -> None:
    template = ChatTemplate.objects.create(
        name="plain", source="{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    )
    page = staff_client.get(f"/admin/playground/chattemplate/{template.pk}/change/").content.decode()
    assert "[user] What is 2 + 2?" in page


def test_a_model_with_an_unknown_device_is_refused(staff_client: Client) -> None:
    response = staff_client.post(
        "/admin/playground/languagemodel/add/",
        {
            "name": "other",
            "source": "/models/x",
            "dtype": "auto",
            "device": "tpu",
            "max_context": "",
            "default_chat_template": "",
            "is_enabled": "on",
        },
    )
    assert response.status_code == 200
    assert "device='tpu'" in " ".join(response.context["adminform"].form.errors["device"])
    assert not LanguageModel.objects.filter(name="other").exists()


def test_an_unset_stop_id_override_is_an_empty_box_not_null(staff_client: Client) -> None:
    model = LanguageModel.objects.get(source="bundled")
    assert model.eos_token_ids is None
    form = staff_client.get(f"/admin/playground/languagemodel/{model.pk}/change/").context["adminform"].form
    html = str(form["eos_token_ids"])
    assert re.search(r">\s*</textarea>", html), html  # it showed "null"
    model.eos_token_ids = [2, 7]
    model.save()
    form = staff_client.get(f"/admin/playground/languagemodel/{model.pk}/change/").context["adminform"].form
    assert "[2, 7]" in str(form["eos_token_ids"])


def test_generations_are_listed_but_not_added_by_hand(staff_client: Client) -> None:
    assert staff_client.get("/admin/playground/generation/").status_code == 200
    assert staff_client.get("/admin/playground/generation/add/").status_code == 403


def test_the_generation_list_shows_timings_rounded(staff_client: Client) -> None:
    """It showed the stored floats whole ("2505.185809000068"); the stats keep them exact."""
    generation = Generation.objects.create(
        owner=owners.LOCAL_API_OWNER,
        model=LanguageModel.default(),
        params={},
        prefill_ms=2400.5,
        ttft_ms=2505.185809000068,
        decode_tok_s=11.623456789,
    )
    listing = staff_client.get("/admin/playground/generation/").content.decode()
    assert "2505.2" in listing and "11.6" in listing
    assert "2505.18" not in listing and "11.62" not in listing
    page = staff_client.get(f"/admin/playground/generation/{generation.pk}/change/").content.decode()
    assert "2400.5" in page and "2505.2" in page and "2505.18" not in page


def test_every_admin_page_names_the_sites_icon(staff_client: Client) -> None:
    """The admin named no icon, so the browser asked for /favicon.ico and got a 404 on each page."""
    pages = [
        Client().get("/admin/login/"),
        staff_client.get("/admin/"),
        staff_client.get("/admin/playground/generation/"),
    ]
    for page in pages:
        assert page.status_code == 200
        assert '<link rel="icon" href="/static/favicon.svg">' in page.content.decode()
    assert finders.find("favicon.svg")


def test_favicon_ico_is_the_sites_icon(client: Client) -> None:
    """What a browser asks for by itself, any page: /favicon.ico leads to the vendored icon."""
    response = client.get("/favicon.ico")
    assert response.status_code == 302 and response["Location"] == "/static/favicon.ico"
    icon = Path(finders.find("favicon.ico")).read_bytes()
    assert icon[:4] == b"\x00\x00\x01\x00"  # an ICO file's header
