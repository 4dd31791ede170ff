"""Who owns conversations and generations: owner ids, and how a request comes by one.

Owns: the owner ids (`browser:<random>`, `api-key:<record id>`, `api:local`), the one place a
browser's owner is kept (its server-side session, under `OWNER_FIELD`), the rotation of the
session key at each page load, and the page token that binds a page's socket and API calls to
the owner the page was rendered for. Must not know: conversations, generations, the protocol's
commands.

Rules:
- An owner id is made by the server and never read from the client. A cookie that is not a live
  session (a forged or guessed key, an API owner's name, an expired key) loads no owner: it sees
  nothing, and a page load gives it a fresh session. No route accepts an owner string.
- Only pages that need one make a session (`start_page`): API calls, `/metrics` and other
  cookie-less requests write no session row.
- Each page load moves the session's data to a new key and deletes the old one (`rotate`), so a
  key that another origin planted in the browser (cookies are not port-scoped: a page on another
  port of this host can set this host's cookies) stops working at the victim's first page load.
  Of concurrent page loads with one key only one moves it (the row is deleted with a count), so
  nobody can make two live keys of one owner.
- The page renders `page_token(owner)`; its socket (`?page_token=`) and its API calls
  (`X-Page-Token`) send it back. A token that does not match the owner of the session the request
  carries means the cookie was swapped after the page loaded: `session_changed`, and the page
  reloads. Clients without a page (scripts, tests) send no token and use their cookie as before.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import parse_qs

from django.contrib.sessions.backends.base import SessionBase
from django.http import HttpRequest
from django.utils.crypto import constant_time_compare, salted_hmac
from django.utils.translation import gettext

from playground.protocol import CommandError

OWNER_FIELD = "playground_owner"  # the session data's key
BROWSER_PREFIX = "browser:"
API_KEY_PREFIX = "api-key:"
LOCAL_API_OWNER = "api:local"  # the keyless localhost client of /v1/ (PLAYGROUND_API_KEYLESS_LOCALHOST)
PAGE_TOKEN_HEADER = "X-Page-Token"
PAGE_TOKEN_PARAM = "page_token"
_PAGE_TOKEN_SALT = "playground.web.owners.page_token"


def new_browser_owner() -> str:
    return BROWSER_PREFIX + secrets.token_hex(16)


def api_key_owner(key_id: int) -> str:
    """The owner of an API key's generations: its record, never a name a client could send."""
    return f"{API_KEY_PREFIX}{key_id}"


def api_key_id(owner: str) -> int | None:
    """The API key record behind an `api_key_owner`, else None."""
    number = owner[len(API_KEY_PREFIX) :] if owner.startswith(API_KEY_PREFIX) else ""
    return int(number) if number.isdigit() else None


def browser_owner(session: SessionBase) -> str | None:
    """The owner kept in a live session; None for no session or a key the store does not know
    (loading the session drops such a key). Sync: the session store is the database."""
    owner = session.get(OWNER_FIELD)
    return owner if isinstance(owner, str) and owner.startswith(BROWSER_PREFIX) else None


def start_page(request: HttpRequest) -> str:
    """For a page that opens the socket or reads conversations: the browser's owner (a fresh
    one, in a new session, for a browser without one), with the session key rotated."""
    session = request.session
    owner = browser_owner(session)
    if owner is None:
        session.flush()  # a fresh key: never keep one the client chose
        session[OWNER_FIELD] = owner = new_browser_owner()
        return owner
    rotate(session)
    return owner


def rotate(session: SessionBase) -> bool:
    """Moves the session's data to a new key and deletes the old one; True when this call did.

    The database store deletes the old row with a count, so of two concurrent rotations of one
    key (two tabs restored at once, or someone trying to copy a session) exactly one moves the
    data; the other leaves its response without a cookie, and that browser keeps the winner's.
    """
    data = session._get_session()  # the loaded data, as cycle_key reads it
    old_key = session.session_key
    model = getattr(session, "model", None)
    if model is None or old_key is None:  # another session store: its own (non-atomic) rotation
        session.cycle_key()
        return True
    num_deleted, _ = model.objects.filter(session_key=old_key).delete()
    if not num_deleted:
        return False
    session._session_cache = data  # kept across create(), as cycle_key does
    session.create()  # a new key holding the same data; the middleware sends its cookie
    return True


def page_token(owner: str) -> str:
    """What a page of `owner` sends back with its socket and API calls (an HMAC: it cannot be
    made without the server's secret key, and it names nothing)."""
    return salted_hmac(_PAGE_TOKEN_SALT, owner).hexdigest()


def check_page_token(owner: str | None, token: str | None) -> None:
    """Refuses a request whose page was rendered for another owner than its session's."""
    if token is None or owner is None:
        return  # no page (a script), or no session left to protect: nothing was swapped in
    if not constant_time_compare(token, page_token(owner)):
        raise CommandError(
            "session_changed",
            gettext(
                "this browser's session changed since the page was loaded (another site may have set its cookie); "
                "reload the page"
            ),
        )


def request_owner(request: HttpRequest) -> str | None:
    """The owner of an HTTP request's browser session (checked against its page's token), or None."""
    owner = browser_owner(request.session)
    check_page_token(owner, request.headers.get(PAGE_TOKEN_HEADER))
    return owner


def scope_page_token(scope: dict[str, Any]) -> str | None:
    """The `page_token` query parameter of a WebSocket's URL."""
    values = parse_qs(scope.get("query_string", b"").decode("latin1")).get(PAGE_TOKEN_PARAM)
    return values[0] if values else None
