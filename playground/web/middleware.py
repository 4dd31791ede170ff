"""Gives every browser a session on its first page load.

Conversations belong to the session, and the WebSocket cannot set a cookie, so the session
must exist (and its cookie be set) before the page opens its socket. The OpenAI-compatible
API (`/v1/`) identifies its clients by key instead, so it gets none.
"""

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse


class EnsureSessionMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.session.session_key and not request.path.startswith("/v1/"):  # API clients have keys
            request.session.save()
            request.session.modified = True  # so SessionMiddleware sets the cookie
        return self.get_response(request)
