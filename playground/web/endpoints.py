"""What every HTTP JSON endpoint of the web process answers alike.

Owns: the methods a view allows, a `CommandError` turned into the JSON error answer
`{"error": {"code", "message"}}` with its status, the CSRF failure answered in JSON under
`/api/`, and the owner a lookup by id uses. Every endpoint module imports this one and none of
each other's (so they form no import circle). Must not know: any endpoint's records.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.csrf import csrf_failure as html_csrf_failure

from playground.protocol import CommandError
from playground.web import owners, request_body

_STATUS_BY_CODE = {
    "not_found": 404,
    "no_session": 403,
    "session_changed": 409,
    "too_many_generations": 429,
    "server_busy": 503,
    "service_unavailable": 503,
    **request_body.STATUS_BY_CODE,
}

View = Callable[..., HttpResponse]


def error_response(code: str, message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """`CSRF_FAILURE_VIEW`: JSON for the API, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return error_response(
            "csrf_failed",
            f"CSRF check failed ({reason}): send the csrftoken cookie's value in the X-CSRFToken header",
            403,
        )
    return html_csrf_failure(request, reason)


def endpoint(*methods: str) -> Callable[[View], View]:
    """Allows `methods` only and turns a `CommandError` into the JSON error answer."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                return error_response(
                    "method_not_allowed", f"{request.method} is not allowed here; use {', '.join(methods)}", 405
                )
            try:
                return view(request, *args, **kwargs)
            except CommandError as exc:
                return error_response(exc.code, exc.message, _STATUS_BY_CODE.get(exc.code, 400))

        return wrapper

    return decorate


def owned_by(request: HttpRequest) -> str:
    """The request's owner for a lookup by id: "" (which owns nothing) when it has none."""
    return owners.request_owner(request) or ""
