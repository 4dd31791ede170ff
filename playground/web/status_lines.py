"""The reason phrase of every HTTP status line daphne writes.

daphne hands the status code to twisted, whose table of phrases stops at the statuses of its
time: a 429 went out as "HTTP/1.1 429 Unknown Status" (and 422, 451, ...). ASGI carries no
phrase, so the table is completed from Python's own `http.HTTPStatus` once, when the ASGI
application is built. Owns nothing else; without twisted (another ASGI server) it does nothing.
"""

from __future__ import annotations

from http import HTTPStatus


def complete_reason_phrases() -> None:
    try:
        from twisted.web import http
    except ImportError:  # not served by daphne
        return
    for status in HTTPStatus:
        http.RESPONSES.setdefault(status.value, status.phrase.encode("ascii"))
