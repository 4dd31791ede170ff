"""An HTTP request's JSON body -> a Python value, or a refusal with a stable code.

Owns: what a body must be before an endpoint of `/api/` or `/v1/` reads a field of it: at most
Django's `DATA_UPLOAD_MAX_MEMORY_SIZE` bytes (`request_too_large`, HTTP 413), UTF-8 text
(`invalid_unicode`; also a lone surrogate spelled `"\\ud800"`, which no database or encoder
accepts, and U+0000, which PostgreSQL's text does not), JSON (`bad_json`), and objects and lists
nested at most `MAX_DEPTH` levels (`nesting_too_deep`: 100,000 levels used to escape as a
`RecursionError`, a 500). The
WebSocket's frames are bounded alike (`frames.py`). Must not know: the endpoints or their error
shapes (each answers a `BodyError`, a `CommandError`, in its own).
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest

from playground.protocol import CommandError
from playground.web.frames import holds_nul, is_unicode, nesting_depth

# The deepest real body is 5 levels (/v1: body -> messages -> message -> content -> part).
MAX_DEPTH = 32
STATUS_BY_CODE = {"request_too_large": 413}  # the other refusals are 400s


class BodyError(CommandError):
    """A body refused before any field is read."""

    @property
    def status(self) -> int:
        return STATUS_BY_CODE.get(self.code, 400)


def json_body(request: HttpRequest, empty: bytes = b"{}") -> Any:
    """The parsed body (`empty` stands for a missing one); raises BodyError."""
    text = _text(_raw(request) or empty)
    try:
        value = json.loads(text)
    except RecursionError:  # the parser's own recursion: far deeper than MAX_DEPTH
        raise too_deep() from None
    except ValueError as exc:
        raise BodyError("bad_json", f"the body is not valid JSON: {exc}") from None
    if nesting_depth(value, MAX_DEPTH) > MAX_DEPTH:
        raise too_deep()
    if not is_unicode(json.dumps(value, ensure_ascii=False)):
        raise BodyError("invalid_unicode", "the body holds a lone surrogate (e.g. \\ud800), which is not valid text")
    if holds_nul(value):
        raise BodyError("invalid_unicode", "the body holds the NUL character (\\u0000), which is not valid text here")
    return value


def too_deep() -> BodyError:
    return BodyError("nesting_too_deep", f"the body nests objects or lists deeper than {MAX_DEPTH} levels")


def too_large(request: HttpRequest) -> BodyError:
    size = request.META.get("CONTENT_LENGTH") or "more"
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return BodyError("request_too_large", f"the body has {size} bytes; the limit is {limit}")


def _raw(request: HttpRequest) -> bytes:
    try:
        return request.body
    except RequestDataTooBig:  # Django refuses to read a body over DATA_UPLOAD_MAX_MEMORY_SIZE
        raise too_large(request) from None


def _text(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError(
            "invalid_unicode", f"the body is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None
