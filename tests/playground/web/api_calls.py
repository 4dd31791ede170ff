"""Calls the `/v1` tests make over the ASGI app: a JSON POST, and a server-sent event stream's payloads."""

from __future__ import annotations

import json
from typing import Any

from django.test import AsyncClient


async def post(path: str, body: dict[str, Any], **headers: str) -> Any:
    return await AsyncClient().post(path, json.dumps(body), content_type="application/json", headers=headers)


def events_of(raw: bytes) -> list[Any]:
    """The `data:` payloads of a server-sent event stream, checking the framing on the way."""
    assert raw.endswith(b"\n\n")
    frames = raw.decode().split("\n\n")[:-1]
    assert all(frame.startswith("data: ") and "\n" not in frame for frame in frames), frames
    return [frame[len("data: ") :] if frame == "data: [DONE]" else json.loads(frame[6:]) for frame in frames]


async def stream_body(response: Any) -> bytes:
    return b"".join([part async for part in response.streaming_content])
