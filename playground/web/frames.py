"""One incoming WebSocket frame -> one command object, or a refusal with a stable code.

Owns: what a frame must be before any command logic sees it: at most
`PLAYGROUND_MAX_MESSAGE_BYTES`, valid JSON, an object, nested at most `MAX_DEPTH` levels, and
text that is valid Unicode (a binary frame's bytes UTF-8; JSON may spell a lone surrogate,
`"\\ud800"`, which no database or encoder accepts, or U+0000, `"\\u0000"`, which PostgreSQL's
text does not). Every refusal leaves the socket usable.
(A text frame that is not UTF-8 never gets here: daphne closes its socket with 1007,
`socket_failures.py`.) Must not know: the commands.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.utils.translation import gettext

from playground.protocol import CommandError

MAX_DEPTH = 16  # the pages send at most 4 levels (command -> overrides -> grammar -> choices; a schema goes as text)


class FrameError(CommandError):
    """A refused frame; `request_id` when the frame was readable enough to have one."""

    def __init__(self, code: str, message: str, request_id: str | None = None) -> None:
        super().__init__(code, message)
        self.request_id = request_id


def parse(text_data: str | None, bytes_data: bytes | None) -> dict[str, Any]:
    """The command object of one frame; raises FrameError."""
    raw: str | bytes = text_data if text_data is not None else (bytes_data or b"")
    size = len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)
    limit = settings.PLAYGROUND_MAX_MESSAGE_BYTES
    if size > limit:
        raise FrameError(
            "message_too_large",
            gettext("the message has %(size)s bytes; the limit is %(limit)s") % {"size": size, "limit": limit},
        )
    if isinstance(raw, bytes):  # a binary frame; a text frame's UTF-8 daphne has checked (socket_failures.py)
        raw = _utf8(raw)
    try:
        content = json.loads(raw)
    except RecursionError:
        raise FrameError("nesting_too_deep", f"the message nests deeper than {MAX_DEPTH} levels") from None
    except (TypeError, ValueError) as exc:
        raise FrameError("bad_json", f"not valid JSON: {exc}") from None
    if not isinstance(content, dict):
        raise FrameError("bad_json", "each message must be a JSON object")
    request_id = content.get("request_id")
    request_id = request_id if isinstance(request_id, str) and is_unicode(request_id) else None
    if nesting_depth(content) > MAX_DEPTH:
        raise FrameError("nesting_too_deep", f"the message nests deeper than {MAX_DEPTH} levels", request_id)
    if not is_unicode(json.dumps(content, ensure_ascii=False)):
        raise FrameError(
            "invalid_unicode", "the message holds a lone surrogate (e.g. \\ud800), which is not valid text", request_id
        )
    if holds_nul(content):
        raise FrameError("invalid_unicode", NUL_REFUSAL, request_id)
    return content


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FrameError(
            "invalid_unicode", f"the message is not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})"
        ) from None


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# PostgreSQL's text and jsonb columns cannot hold U+0000: a chat message with one was saved on
# SQLite and an `internal_error` on PostgreSQL (found running the system tests there). It is
# refused alike on both, before anything is written.
NUL_REFUSAL = "the message holds the NUL character (\\u0000), which is not valid text here"


def holds_nul(value: Any) -> bool:
    """Whether a string anywhere in `value` (a parsed JSON value; keys too) holds U+0000."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(key) or holds_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(holds_nul(item) for item in value)
    return False


def nesting_depth(value: Any, bound: int = MAX_DEPTH) -> int:
    """Levels of objects and lists, counted up to `bound` + 1 (iterative: the parser already
    bounded the recursion)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > bound:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest
