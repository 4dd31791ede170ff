"""The language every page, the admin, the JavaScript and the WebSocket's messages speak.

Owns: choosing one language per request and per socket, and keeping a person's choice.
The order: the choice stored on the signed-in account, else the one stored in the session
(the browser's identity, which also owns its conversations), else Django's own rule (the
`django_language` cookie, then the browser's Accept-Language), else English. A choice is made
with `POST /i18n/setlang/` (the language switch of every page) and stored in all three places:
the account, so it follows a person to another browser; the session, so the socket knows it;
the cookie, so it outlives a sign-out. The OpenAI-compatible API (`/v1/`) speaks English to
every client, as OpenAI's does (its clients are programs; a browser's language there is no
choice of theirs). Must not know: the pages or what they say.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.middleware.locale import LocaleMiddleware
from django.utils import translation
from django.utils.http import url_has_allowed_host_and_scheme

from playground.web.endpoints import error_response

SESSION_KEY = "language"
# What the choice is read from in a form or query: Django's own set_language uses the same name.
FIELD = "language"
ENGLISH_ONLY_PREFIX = "/v1/"  # the OpenAI-compatible API


def supported(code: Any) -> str | None:
    """`code` as one of settings.LANGUAGES' codes (exact, case-insensitive), else None."""
    if not isinstance(code, str):
        return None
    return next((known for known, _name in settings.LANGUAGES if known == code.strip().lower()), None)


def stored_language(session: Any, user: Any) -> str | None:
    """The person's own choice: the account's (signed in), else the session's; None if none."""
    if user is not None and user.is_authenticated:
        from playground.models import UserLanguage

        choice = UserLanguage.objects.filter(user=user).values_list("language", flat=True).first()
        if supported(choice):
            return choice
    return supported(session.get(SESSION_KEY)) if session is not None else None


class LanguageMiddleware(LocaleMiddleware):
    """Django's LocaleMiddleware (Vary and Content-Language on the response), with a stored
    choice first. Sits after the session and authentication middleware."""

    def process_request(self, request: HttpRequest) -> None:
        if request.path_info.startswith(ENGLISH_ONLY_PREFIX):
            translation.activate(settings.LANGUAGE_CODE)
            request.LANGUAGE_CODE = translation.get_language()
            return
        chosen = stored_language(getattr(request, "session", None), getattr(request, "user", None))
        translation.activate(chosen or translation.get_language_from_request(request))
        request.LANGUAGE_CODE = translation.get_language()


def scope_language(scope: dict[str, Any]) -> str:
    """The language of a WebSocket connection, by the same rule as a page (no account: the
    socket carries the session only). Reads the session: call it off the event loop."""
    chosen = stored_language(scope.get("session"), None)
    if chosen:
        return chosen
    headers = dict(scope.get("headers") or [])
    accept = headers.get(b"accept-language", b"").decode("latin-1")
    request = SimpleNamespace(COOKIES=scope.get("cookies") or {}, META={"HTTP_ACCEPT_LANGUAGE": accept})
    return translation.get_language_from_request(request)


def set_language(request: HttpRequest) -> HttpResponse:
    """`POST /i18n/setlang/` with `language` (and `next`, a page of this site): stores the
    choice and goes back to that page. Anything but a known language is refused, nothing stored."""
    if request.method != "POST":
        return error_response("method_not_allowed", f"{request.method} is not allowed here; use POST", 405)
    raw = request.POST.get(FIELD)
    language = supported(raw)
    if language is None:
        known = ", ".join(code for code, _name in settings.LANGUAGES)
        return error_response("invalid_field", f"{FIELD}={raw!r} must be one of {known}", 400)
    request.session[SESSION_KEY] = language
    if request.user.is_authenticated:
        from playground.models import UserLanguage

        UserLanguage.objects.update_or_create(user=request.user, defaults={"language": language})
    response = HttpResponseRedirect(_next_page(request))
    response.set_cookie(
        settings.LANGUAGE_COOKIE_NAME,
        language,
        max_age=settings.LANGUAGE_COOKIE_AGE,
        samesite=settings.LANGUAGE_COOKIE_SAMESITE,
        secure=request.is_secure(),
        httponly=True,
    )
    return response


def _next_page(request: HttpRequest) -> str:
    """`next`, else the page the form was on; only a page of this site (no open redirect)."""
    for candidate in (request.POST.get("next"), request.META.get("HTTP_REFERER")):
        if candidate and url_has_allowed_host_and_scheme(
            candidate, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            return candidate
    return "/"
