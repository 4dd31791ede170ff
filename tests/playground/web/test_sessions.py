"""Sessions and ownership (docs/reliability.md, "Sessions"): a cookie is only a way to find a
server-side session, whose owner id the server made. Forged keys, owner names sent as cookies,
a key planted by another origin, a swapped cookie under an open page, and the rows that API
calls must not create."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client

from playground.asgi import application
from playground.models import ApiKey, Conversation, Generation
from playground.web import consumers, owners, submit
from tests.playground.conftest import Browser, new_browser
from tests.playground.sent_tasks import on_task

from .test_api import csrf, owner_of, send
from .test_consumer import HOST, ORIGIN, TIMEOUT_S, command

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)  # the consumer runs in threads


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    on_task(monkeypatch, "run_generation", apply_async=lambda args, **options: None)


def api_key() -> ApiKey:
    key = ApiKey(name="grader")
    key.set_new_key()
    key.save()
    return key


def client_with_cookie(session_key: str) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.cookies["sessionid"] = session_key
    return client


def socket(session_key: str | None, page_token: str | None = None) -> WebsocketCommunicator:
    path = "/ws/generate/" + (f"?page_token={page_token}" if page_token is not None else "")
    headers = [HOST, ORIGIN] + ([(b"cookie", f"sessionid={session_key}".encode())] if session_key else [])
    return WebsocketCommunicator(application, path, headers=headers)


# ---- forged keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "forged",
    [
        "api-key-{key_id}",  # what API rows were filed under before: a name anyone could send
        "api-key:{key_id}",
        "api-local",
        owners.LOCAL_API_OWNER,
        "a-random-string-of-32-characters",
    ],
)
def test_a_forged_session_cookie_sees_nothing_and_a_page_gives_it_a_fresh_session(forged: str) -> None:
    key = api_key()
    secret = [{"role": "user", "content": "the key's secret"}]
    keyed = submit.api_chat(owners.api_key_owner(key.pk), {}, secret, 1, 2)[0]
    local = submit.api_complete(owners.LOCAL_API_OWNER, {}, [("the local client's secret", [])], 1, 2)[0][0]
    forged = forged.format(key_id=key.pk)
    attacker = client_with_cookie(forged)
    assert attacker.get("/api/conversations/").json() == []
    assert attacker.get(f"/api/conversations/{keyed.conversation_id}/").status_code == 404
    for generation_id in (keyed.generation_id, local.generation_id):
        assert attacker.get(f"/api/generations/{generation_id}/").status_code == 404
        assert attacker.get(f"/api/generations/{generation_id}/steps.csv").status_code == 404
    headers = csrf(attacker)
    assert send(attacker, "delete", f"/api/conversations/{keyed.conversation_id}/", **headers).status_code == 404
    assert Conversation.objects.filter(pk=keyed.conversation_id).exists()

    attacker.get("/")
    fresh = attacker.cookies["sessionid"].value
    assert fresh != forged and owner_of(attacker) not in (owners.api_key_owner(key.pk), owners.LOCAL_API_OWNER)
    assert attacker.get("/api/conversations/").json() == []


async def test_a_forged_cookie_cannot_follow_stop_or_spend_another_clients_generations() -> None:
    key = await sync_to_async(api_key)()
    owner = owners.api_key_owner(key.pk)
    ((theirs,),) = await sync_to_async(submit.api_complete)(owner, {}, [("secret", [])], 1, 1)
    ws = socket(f"api-key-{key.pk}")
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    for name in ("attach", "stop"):
        refusal = await command(ws, name, generation_id=theirs.generation_id)
        assert (refusal["type"], refusal["code"]) == ("error", "not_found")
    mine = await command(ws, "complete", text="mine")  # filed under the socket's own owner
    assert mine["type"] == "generation.queued"
    await ws.disconnect()
    assert (await Generation.objects.aget(pk=mine["generation_id"])).owner.startswith(owners.BROWSER_PREFIX)
    assert (await Generation.objects.aget(pk=theirs.generation_id)).status == "queued"  # not stopped
    # The key's single slot is still its own: the forged cookie spent nothing of it.
    assert await Generation.objects.filter(owner=owner, status="queued").acount() == 1


# ---- rotation and planted keys -------------------------------------------------------------


def test_each_page_load_moves_the_session_to_a_new_key() -> None:
    browser = Client(enforce_csrf_checks=True)
    browser.get("/")
    first_key, owner = browser.cookies["sessionid"].value, owner_of(browser)
    created = send(browser, "post", "/api/conversations/", {"title": "mine"}, **csrf(browser)).json()
    browser.get("/")
    second_key = browser.cookies["sessionid"].value
    assert second_key != first_key and owner_of(browser) == owner
    assert [c["id"] for c in browser.get("/api/conversations/").json()] == [created["id"]]
    # Whoever kept the old key (e.g. read it off the wire) holds nothing now.
    stale = client_with_cookie(first_key)
    assert stale.get("/api/conversations/").json() == []
    assert stale.get(f"/api/conversations/{created['id']}/").status_code == 404
    assert not Session.objects.filter(session_key=first_key).exists()


def test_a_key_planted_by_another_origin_is_replaced_at_the_first_page_load() -> None:
    """A page on another port of this host sets `sessionid` to a key its author got from us."""
    attacker = Client(enforce_csrf_checks=True)
    attacker.get("/")
    planted = attacker.cookies["sessionid"].value
    victim = client_with_cookie(planted)
    victim.get("/")
    assert victim.cookies["sessionid"].value != planted
    created = send(victim, "post", "/api/conversations/", {"title": "the victim's"}, **csrf(victim)).json()
    queued = submit.generate(owner_of(victim), {"content": "a secret question"})
    assert attacker.get("/api/conversations/").json() == []
    for path in (f"/api/conversations/{created['id']}/", f"/api/generations/{queued.generation_id}/"):
        assert attacker.get(path).status_code == 404


def test_of_two_concurrent_page_loads_with_one_key_only_one_moves_the_session(owner: str, session_key: str) -> None:
    """Two tabs restored at once, or someone racing to copy a session: never two live keys."""
    first, second = SessionStore(session_key), SessionStore(session_key)
    assert owners.browser_owner(first) == owners.browser_owner(second) == owner  # both loaded it
    assert [owners.rotate(first), owners.rotate(second)] == [True, False]
    first.save()
    holders = [s for s in Session.objects.all() if s.get_decoded().get(owners.OWNER_FIELD) == owner]
    assert [s.session_key for s in holders] == [first.session_key] != [session_key]


def test_the_session_cookie_is_httponly_and_samesite_lax() -> None:
    browser = Client()
    browser.get("/")
    cookie = browser.cookies["sessionid"]
    assert cookie["httponly"] and cookie["samesite"] == "Lax"
    assert cookie["path"] == "/" and not cookie["secure"]  # PLAYGROUND_HTTPS is off in tests


# ---- the page token ------------------------------------------------------------------------


def test_the_page_renders_its_token(browser_session: Browser) -> None:
    page = client_with_cookie(browser_session.session_key).get("/").content.decode()
    assert f'<meta name="page-token" content="{browser_session.page_token}">' in page


async def test_a_socket_whose_cookie_was_swapped_under_its_page_is_told_to_reload() -> None:
    victim, attacker = await sync_to_async(new_browser)(), await sync_to_async(new_browser)()
    ws = socket(attacker.session_key, page_token=victim.page_token)  # the planted cookie rides along
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    refusal = await ws.receive_json_from(timeout=TIMEOUT_S)
    assert (refusal["type"], refusal["code"]) == ("error", "session_changed")
    assert (await ws.receive_output(timeout=TIMEOUT_S))["code"] == consumers.SESSION_CHANGED_CLOSE_CODE
    await ws.send_json_to({"command": "complete", "text": "sent before the close was read"})
    assert await ws.receive_nothing(timeout=0.5)
    assert not await Generation.objects.aexists()


@pytest.mark.parametrize("cookie", ["own", "none", "unknown"])
async def test_a_socket_with_its_pages_token_works(cookie: str) -> None:
    """Its own session; or none left at all (cookies blocked or deleted): then it owns what it
    starts on its own, and nothing was swapped in that anyone else could read."""
    browser = await sync_to_async(new_browser)()
    session_key = {"own": browser.session_key, "none": None, "unknown": secrets.token_hex(16)}[cookie]
    ws = socket(session_key, page_token=browser.page_token)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    queued = await command(ws, "complete", text="hi")
    assert queued["type"] == "generation.queued", queued
    await ws.disconnect()
    owner = (await Generation.objects.aget(pk=queued["generation_id"])).owner
    assert (owner == browser.owner) == (cookie == "own")


def test_an_api_call_whose_cookie_was_swapped_under_its_page_is_refused(browser_session: Browser) -> None:
    attacker = new_browser()
    victim = client_with_cookie(attacker.session_key)
    response = victim.get("/api/conversations/", headers={owners.PAGE_TOKEN_HEADER: browser_session.page_token})
    assert (response.status_code, response.json()["error"]["code"]) == (409, "session_changed")
    headers = {owners.PAGE_TOKEN_HEADER: browser_session.page_token, "Accept-Language": "zh-CN"}
    assert "请重新加载页面" in victim.get("/api/conversations/", headers=headers).json()["error"]["message"]
    own = client_with_cookie(browser_session.session_key)
    assert own.get("/api/conversations/", headers={owners.PAGE_TOKEN_HEADER: browser_session.page_token}).json() == []


# ---- no session rows for API calls (issue 27, item 5) ----------------------------------------


@pytest.mark.parametrize("path", ["/v1/models", "/api/models/", "/api/presets/", "/api/conversations/", "/metrics"])
def test_api_calls_add_no_session_rows(path: str) -> None:
    before = Session.objects.count()
    for _ in range(100):
        response = Client().get(path)
        assert response.status_code == 200, response.content[:300]
        assert "sessionid" not in response.cookies
    assert Session.objects.count() == before


def test_only_the_pages_that_need_a_session_make_one() -> None:
    # the lesson starts generations and asks about them by id (its roofline): it is an owner's page too
    pages = [("/", True), ("/explorer/", True), ("/explorer/ab/", True), ("/learn/", True)]
    for path, makes_one in [*pages, ("/serving/", False), ("/architecture/", False)]:
        before = Session.objects.count()
        response = Client().get(path)
        assert response.status_code == 200
        assert ("sessionid" in response.cookies, Session.objects.count() - before) == (makes_one, int(makes_one))
        assert ('<meta name="page-token"' in response.content.decode()) == makes_one, path


def test_a_cookieless_post_is_refused_without_writing_anything(settings: Any) -> None:
    client = Client()  # no CSRF enforcement: only the owner rule stands in the way
    response = send(client, "post", "/api/conversations/", {"title": "x"})
    assert (response.status_code, response.json()["error"]["code"]) == (403, "no_session")
    assert not Conversation.objects.exists() and not Session.objects.exists()
