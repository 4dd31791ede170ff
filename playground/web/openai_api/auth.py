"""Who is calling the API: an `Authorization: Bearer` key from the admin's `ApiKey` records, or
(setting `PLAYGROUND_API_KEYLESS_LOCALHOST`, on by default for `make run`) a local client
without one.

Owns: the key check (hashed lookup, revoked keys refused), the owner a generation is filed
under (`Client.owner`: the key's record, or the keyless local client's, from
`playground.web.owners`, never a value the client sends), and the client's concurrency (the
key's own, else `PLAYGROUND_API_MAX_CONCURRENT`). On localhost without a key requirement, a
bearer token that is not one of ours (no `pg-` prefix, e.g. the "none" that clients insist on
sending) is ignored, and so is an empty one (`Bearer ` with nothing after it, what several
tools send when no key is configured); a `pg-` token that does not match is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone

from playground.models import ApiKey
from playground.web import owners
from playground.web.openai_api.errors import ApiError

_LOCAL_ADDRESSES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class Client:
    owner: str  # who owns its generations (`playground.web.owners`)
    max_concurrent: int  # generations running at once; more wait for their turn (`turns`)


def authenticate(request: HttpRequest) -> Client:
    token = _bearer_token(request)
    keyless = settings.PLAYGROUND_API_KEYLESS_LOCALHOST and request.META.get("REMOTE_ADDR") in _LOCAL_ADDRESSES
    if keyless and (token is None or not token.startswith(ApiKey.PREFIX)):
        return Client(owners.LOCAL_API_OWNER, settings.PLAYGROUND_API_MAX_CONCURRENT)
    if token is None:
        raise _unauthorized("no API key: send the header 'Authorization: Bearer <key>' (keys are made in the admin)")
    key = ApiKey.objects.filter(key_hash=ApiKey.hash(token), is_active=True).first()
    if key is None:
        raise _unauthorized(f"incorrect or revoked API key {token[:10]}...")
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
    return Client(owners.api_key_owner(key.pk), key.max_concurrent or settings.PLAYGROUND_API_MAX_CONCURRENT)


def _bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "").strip()
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        raise _unauthorized("the Authorization header must be 'Bearer <key>'")
    return token.strip() or None  # "Bearer " with an empty key: no key


def _unauthorized(message: str) -> ApiError:
    return ApiError(message, code="invalid_api_key", status=401)
