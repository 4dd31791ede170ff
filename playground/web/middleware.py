"""HTTP middleware: the Content-Security-Policy on every page, and JSON errors under `/api/` and
`/v1/` whatever DEBUG is (never Django's HTML or debug page, which names settings and source
paths). (Sessions are made by the pages that need one: `pages.owner_page`; API calls and
`/metrics` make none.)

Owns: these response-wide rules. Must not know: the views behind them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import (
    BadRequest,
    DisallowedHost,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.http import HttpRequest, HttpResponse
from django.urls import Resolver404, resolve

from playground.web import request_body
from playground.web.endpoints import error_response
from playground.web.openai_api.errors import ApiError

logger = logging.getLogger(__name__)

API_PREFIXES = ("/api/", "/v1/")
# The code of a Django error page turned into JSON, by status (a view's own errors have theirs).
_CODE_BY_STATUS = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "request_too_large",
    500: "internal_error",
}


class ContentSecurityPolicyMiddleware:
    """Sends `PLAYGROUND_CSP` (no inline script or style, every source this origin) on every
    response, the admin's included; `connect-src` names this host's WebSocket explicitly.
    Django's own DEBUG error pages (inline styles and scripts) go without it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if settings.DEBUG and response.status_code in (404, 500) and _is_html(response):
            return response
        if "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = settings.PLAYGROUND_CSP.replace("{ws_origin}", _ws_origin(request))
        return response


def _ws_origin(request: HttpRequest) -> str:
    """This host's WebSocket origin; none for a Host outside ALLOWED_HOSTS (whose 400 this
    middleware must not turn into a second exception: that one would be Django's page)."""
    try:
        host = request.get_host()
    except DisallowedHost:
        return ""
    return f"{'wss' if request.is_secure() else 'ws'}://{host}"


class ApiErrorMiddleware:
    """Under /api/ and /v1/ every refusal and failure is that API's JSON error (`/api/`'s
    `{"error": {code, message}}`, `/v1/`'s OpenAI shape), DEBUG or not. Checked before anything
    reads the request: a Host outside ALLOWED_HOSTS (400 `disallowed_host`), a URL no endpoint
    has (404 `not_found`) and a declared body over DATA_UPLOAD_MAX_MEMORY_SIZE (413
    `request_too_large`, also for a form body the CSRF check would read). A view's exception
    Django would render as a page (a RecursionError, a body too large, bytes that are not
    UTF-8, a suspicious request) gets its own code; any other error page of Django's (a 500,
    whose traceback stays in the server log) becomes the JSON error of its status."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not is_api(request):
            return self.get_response(request)
        refusal = _refusal_before_reading(request)
        if refusal is not None:
            return refusal
        response = self.get_response(request)
        if response.status_code >= 400 and _is_html(response):  # Django's page: the API sends no HTML
            return _status_error(request, response.status_code)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not is_api(request):
            return None
        known = _known_exception(request, exception)
        if known is None:
            return None  # Django's 500 (logged with its traceback), made JSON by __call__
        logger.warning("%s %s refused: %r", request.method, request.path, exception)
        code, message, status = known
        return api_error(request, code, message, status)


def is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


def api_error(request: HttpRequest, code: str, message: str, status: int) -> HttpResponse:
    """The error in the shape of the API `request` is for."""
    if request.path.startswith("/v1/"):
        return ApiError(message, code=code, status=status).response()
    return error_response(code, message, status)


def _refusal_before_reading(request: HttpRequest) -> HttpResponse | None:
    try:
        request.get_host()
    except DisallowedHost:
        return api_error(request, "disallowed_host", "the Host header names a host this server does not serve", 400)
    if not _resolves(request.path_info):
        # Answered here, before CommonMiddleware's APPEND_SLASH: a redirect loses a POST's body,
        # and with DEBUG a POST without the slash was a RuntimeError (a 500).
        hint = f" (its URL ends with a slash: {request.path}/)" if _resolves(request.path_info + "/") else ""
        return api_error(request, "not_found", f"no API endpoint at {request.path}{hint}", 404)
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return api_error(request, "bad_request", "the Content-Length header is not a number", 400)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and declared > limit:
        error = request_body.too_large(request)
        return api_error(request, error.code, error.message, error.status)
    return None


def _resolves(path: str) -> bool:
    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def _known_exception(request: HttpRequest, exception: Exception) -> tuple[str, str, int] | None:
    """(code, message, status) of an exception that is the client's doing, else None."""
    if isinstance(exception, request_body.BodyError):
        return exception.code, exception.message, exception.status
    if isinstance(exception, RecursionError):
        error = request_body.too_deep()
        return error.code, error.message, error.status
    if isinstance(exception, UnicodeDecodeError):
        return "invalid_unicode", "the request holds bytes that are not UTF-8 text", 400
    if isinstance(exception, RequestDataTooBig):
        error = request_body.too_large(request)
        return error.code, error.message, error.status
    if isinstance(exception, (SuspiciousOperation, BadRequest)):
        return "bad_request", "the request is malformed", 400
    if isinstance(exception, PermissionDenied):
        return "forbidden", "this request is not allowed", 403
    return None


def _status_error(request: HttpRequest, status: int) -> HttpResponse:
    code = _CODE_BY_STATUS.get(status, "bad_request" if status < 500 else "internal_error")
    if status == 404:
        message = f"no API endpoint at {request.path}"
    elif status >= 500:
        message = "the server failed to answer this request"
    else:
        message = f"the request was refused ({status} {_phrase(status)})"
    return api_error(request, code, message, status)


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "error"


def _is_html(response: HttpResponse) -> bool:
    return response.get("Content-Type", "").startswith("text/html")
