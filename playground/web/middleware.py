"""HTTP middleware: the Content-Security-Policy on every page, and JSON (never Django's HTML or
debug page) for an unknown `/api/` URL. (Sessions are made by the pages that need one:
`pages.owner_page`; API calls and `/metrics` make none.)

Owns: these response-wide rules. Must not know: the views behind them.
"""

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from playground.web.api import error_response


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
            ws_scheme = "wss" if request.is_secure() else "ws"
            response["Content-Security-Policy"] = settings.PLAYGROUND_CSP.replace(
                "{ws_origin}", f"{ws_scheme}://{request.get_host()}"
            )
        return response


class ApiNotFoundMiddleware:
    """An unknown URL under /api/ answers the API's JSON 404, whatever DEBUG is (Django's
    DEBUG page would list every URL pattern)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if request.path.startswith("/api/") and response.status_code == 404 and _is_html(response):
            return error_response("not_found", f"no API endpoint at {request.path}", 404)
        return response


def _is_html(response: HttpResponse) -> bool:
    return response.get("Content-Type", "").startswith("text/html")
