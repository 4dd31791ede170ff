"""OpenAI's error shape and HTTP statuses for everything the API refuses or that fails.

Owns: `ApiError` (message, type, param, code, status, and `Retry-After` for the refusals
that pass: a client's own backlog is full (429), the server's queue is full or no worker is
alive (503)), the mapping from the protocol's stable codes (`playground.protocol.ERROR_CODES`)
and from `SamplingParams`' ValueErrors (which name their field) to it. Must not know: the
channel layer, the ORM.
"""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import JsonResponse

from playground.protocol import CommandError

# (HTTP status, OpenAI error type) by protocol error code.
_BY_CODE = {
    "bad_json": (400, "invalid_request_error"),
    "nesting_too_deep": (400, "invalid_request_error"),
    "invalid_unicode": (400, "invalid_request_error"),
    "request_too_large": (413, "invalid_request_error"),
    "invalid_field": (400, "invalid_request_error"),
    "invalid_params": (400, "invalid_request_error"),
    "prompt_too_long": (400, "invalid_request_error"),
    "not_found": (404, "invalid_request_error"),
    "too_many_generations": (429, "rate_limit_error"),
    "server_busy": (503, "server_error"),
    "service_unavailable": (503, "server_error"),
    "model_unavailable": (503, "server_error"),
    "worker_lost": (503, "server_error"),
    "inspection_timeout": (504, "server_error"),
    "kv_handoff_failed": (500, "server_error"),
    "internal_error": (500, "server_error"),
}
# Seconds a client should wait before it tries again (`Retry-After`; OpenAI's clients honour it
# up to 60 s), by code: a client's own generations end within seconds; a full server queue or a
# missing worker takes longer.
RETRY_AFTER_S = {
    "too_many_generations": 1,
    "server_busy": 2,
    "worker_lost": 5,
    "queue_unreachable": 5,
    "service_unavailable": 5,
}
# Our sampling settings' names -> the request field a client sent.
_FIELD_NAMES = {"max_new_tokens": "max_tokens", "num_alternatives": "top_logprobs"}


class ApiError(Exception):
    """A refused or failed request, answered as `{"error": {message, type, param, code}}`."""

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400, kind: str = ""
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.code, self.status = message, param, code, status
        self.type = kind or ("invalid_request_error" if status < 500 else "server_error")
        self.retry_after_s = RETRY_AFTER_S.get(code or "") if status in (429, 503) else None

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        if self.retry_after_s is not None:
            response["Retry-After"] = str(self.retry_after_s)
        return response

    def sse(self) -> bytes:
        """The error as one server-sent event (after the stream's headers went out)."""
        return f"data: {json.dumps(self.body())}\n\n".encode()


def invalid(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(message, param=param, code=code)


def from_command_error(exc: CommandError, param: str | None = None) -> ApiError:
    """A refusal of `submit` or a worker's error event, with the field it names when it names one."""
    status, kind = _BY_CODE.get(exc.code, (500, "server_error"))
    return ApiError(exc.message, param=param or field_named(exc.message), code=exc.code, status=status, kind=kind)


def from_event(event: dict[str, Any]) -> ApiError:
    """A `generation.error` event."""
    code = event.get("code", "internal_error")
    return from_command_error(CommandError(code if code in _BY_CODE else "internal_error", event.get("message", "")))


def field_named(message: str) -> str | None:
    """The request field a message like "top_p=1.5 must be ..." is about, in the client's words."""
    match = re.match(r"\s*(\w+)(=| is | must | exceeds)", message)
    if match is None:
        return None
    name = match.group(1)
    return _FIELD_NAMES.get(name, name)
