"""HTTP-wide rules: a strict Content-Security-Policy on every page (the admin's included)
that the pages actually satisfy, and JSON 404s under /api/ whatever DEBUG is."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

pytestmark = pytest.mark.django_db

PAGES = ["/", "/explorer/", "/learn/", "/admin/login/"]
STAFF_PAGES = ["/admin/", "/admin/playground/samplingpreset/add/", "/admin/playground/generation/"]


def policy(response: Any) -> dict[str, str]:
    directives = (part.strip().split(" ", 1) for part in response["Content-Security-Policy"].split(";"))
    return {name: (rest[0] if rest else "") for name, *rest in directives}


def test_every_page_sends_a_strict_csp(client: Client) -> None:
    staff = Client()
    staff.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    for path, response in [*((p, client.get(p)) for p in PAGES), *((p, staff.get(p)) for p in STAFF_PAGES)]:
        assert response.status_code == 200, path
        csp = policy(response)
        assert csp["default-src"] == "'self'" and csp["script-src"] == "'self'" and csp["style-src"] == "'self'", path
        assert csp["img-src"] == "'self' data:" and csp["object-src"] == "'none'" and csp["frame-ancestors"] == "'none'"
        assert csp["connect-src"] == "'self' ws://testserver", path
        assert "unsafe" not in response["Content-Security-Policy"], path
    assert "Content-Security-Policy" in client.get("/api/models/")


@pytest.mark.parametrize("path", [*PAGES, *STAFF_PAGES])
def test_the_pages_need_nothing_the_csp_forbids(client: Client, path: str) -> None:
    """No inline script, event handler or style attribute: under the CSP they would not run."""
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    html = client.get(path).content.decode()
    inline_scripts = [tag for tag in re.findall(r"<script\b[^>]*>", html) if "src=" not in tag and "json" not in tag]
    assert inline_scripts == [], path
    assert not re.search(r"<[^>]+\sstyle=", html), path
    assert not re.search(r"<[^>]+\son[a-z]+=", html), path
    assert "<style" not in html, path


def test_the_admin_detail_pages_need_nothing_the_csp_forbids(client: Client) -> None:
    """Pages with the admin's own HTML (`_pre` blocks): a class and admin.css, no style attribute."""
    from playground.models import ChatTemplate, Generation, LanguageModel

    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    model = LanguageModel.objects.first()
    LanguageModel.objects.filter(pk=model.pk).update(test_load_result={"load_ms": 1})
    template = ChatTemplate.objects.create(name="t", source="{% for m in messages %}{{ m.content }}{% endfor %}")
    generation = Generation.objects.create(owner="browser:" + "s" * 32, model=model, params={"max_new_tokens": 3})
    for path in [
        f"/admin/playground/languagemodel/{model.pk}/change/",
        f"/admin/playground/chattemplate/{template.pk}/change/",
        f"/admin/playground/generation/{generation.pk}/change/",
    ]:
        html = client.get(path).content.decode()
        assert '<pre class="pg-pre">' in html and "css/admin.css" in html, path
        assert not re.search(r"<[^>]+\sstyle=", html), path


@pytest.mark.parametrize("debug", [True, False])
@pytest.mark.parametrize("path", ["/api/generations/abc/", "/api/nope/", "/api/conversations/1/x"])
def test_unknown_api_urls_answer_json_404(client: Client, settings: Any, debug: bool, path: str) -> None:
    settings.DEBUG = debug
    response = client.get(path)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": {"code": "not_found", "message": f"no API endpoint at {path}"}}


def test_a_missing_record_keeps_its_own_json_404(client: Client) -> None:
    response = client.get("/api/generations/999999/")
    assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")
    assert "999999" in response.json()["error"]["message"]
