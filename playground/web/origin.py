"""Which pages may open the generation WebSocket (the Origin check against cross-site WebSocket
hijacking) or call `/v1/` from a browser.

Owns: the allow list (scheme, host and port, compared exactly) and the refusal. The session
cookie rides along with any WebSocket a browser opens, whatever page opens it, so a page on
another port or scheme of the same host (`http://127.0.0.1:9999`, `https://127.0.0.1:8000`)
must be refused just like another site. Allowed: the origins in `PLAYGROUND_ALLOWED_ORIGINS`
when it is set (a deployment behind a proxy names its public origin there), else exactly
the origin the socket itself was opened at (its scheme and `Host` header), provided that
host is one of `ALLOWED_HOSTS`. An HTTP request without an Origin header is no browser's
cross-origin request and passes (`http_origin_allowed`). Must not know: the consumer or the
protocol.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlparse

from channels.security.websocket import OriginValidator, WebsocketDenier
from django.conf import settings
from django.http import HttpRequest
from django.http.request import split_domain_port, validate_host

logger = logging.getLogger(__name__)

_DEBUG_HOSTS = [".localhost", "127.0.0.1", "[::1]"]  # what Django allows in DEBUG with no ALLOWED_HOSTS


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for header_name, value in scope.get("headers", []):
        if header_name == name:
            return value.decode("latin1")
    return None


def own_origin(scope: dict[str, Any]) -> str | None:
    """`scheme://host[:port]` the socket was opened at, if its Host is an allowed host."""
    host = _header(scope, b"host")
    if not host:
        return None
    domain, _ = split_domain_port(host)
    allowed_hosts = settings.ALLOWED_HOSTS or (_DEBUG_HOSTS if settings.DEBUG else [])
    if not domain or domain.startswith(".") or not validate_host(domain, allowed_hosts):
        return None
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    return f"{scheme}://{host}"


def allowed_origins(scope: dict[str, Any]) -> list[str]:
    if settings.PLAYGROUND_ALLOWED_ORIGINS:
        return list(settings.PLAYGROUND_ALLOWED_ORIGINS)
    origin = own_origin(scope)
    return [origin] if origin else []


def is_allowed(origin: str | None, allowed: list[str]) -> bool:
    """Channels' comparison (scheme, host and port; default ports filled in) against `allowed`.
    An origin whose port is no number (`http://127.0.0.1:8000.evil.com`) is refused: reading its
    port raises ValueError, which was a 500 (with DEBUG, a page naming the settings)."""
    try:
        parsed = urlparse(origin) if origin else None
        return parsed is not None and any(_MATCHER.match_allowed_origin(parsed, pattern) for pattern in allowed)
    except ValueError:
        return False


def http_origin_allowed(request: HttpRequest) -> bool:
    """An HTTP request carries no Origin (not a browser's cross-origin call) or an allowed one;
    its own origin is its scheme (`request.scheme`, which trusts a TLS proxy's header only with
    PLAYGROUND_HTTPS) and Host."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    scope = {"scheme": request.scheme, "headers": [(b"host", request.META.get("HTTP_HOST", "").encode("latin1"))]}
    return is_allowed(origin, allowed_origins(scope))


class SameOriginValidator(OriginValidator):
    """Channels' `OriginValidator` (scheme, host and port must all match; default ports
    filled in) with the allow list of `allowed_origins`, computed per connection."""

    def __init__(self, application: Any) -> None:
        super().__init__(application, allowed_origins=[])

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("SameOriginValidator guards WebSocket connections only")
        origin = _header(scope, b"origin")
        allowed = allowed_origins(scope)
        if is_allowed(origin, allowed):
            return await self.application(scope, receive, send)
        logger.warning("refused a WebSocket from origin %r; allowed: %s", origin, allowed or "none")
        return await WebsocketDenier()(scope, receive, send)


_MATCHER = OriginValidator(None, [])  # only its comparison is used
