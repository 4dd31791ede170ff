"""JSON text made once and reused. A worker encodes each step record when it makes it; that
text goes to Redis (the recent steps), joined into the messages to the web process
(`protocol.generation_steps`), and joined into the row's saved steps, which are
rewritten whole as the answer grows: encoding them again at each save (the standard library
takes ~35 us a step, orjson ~2) was a large part of a task thread's time with 16 streams.

Owns: `dumps` (orjson: non-finite floats as null, as browsers' JSON.parse and PostgreSQL's
jsonb need), `EncodedList` (a list whose JSON is its items' texts joined) and `Encoder` (the
steps field's encoder: writes an `EncodedList` as it is, anything else as `json` does).
Must not know: the ORM's models, the channel layer, sockets.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """`value` as compact JSON text; NaN and infinities become null."""
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def loads(text: str | bytes) -> Any:
    return orjson.loads(text)


class EncodedList:
    """A JSON list given as its items' encoded texts (each one valid JSON)."""

    __slots__ = ("texts",)

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def __len__(self) -> int:
        return len(self.texts)

    def to_json(self) -> str:
        return "[" + ",".join(self.texts) + "]"


class Encoder(json.JSONEncoder):
    """A JSON field's encoder that takes an `EncodedList` value as it is (Django encodes a
    field's value whole, so a list given at the top is all this needs)."""

    def encode(self, o: Any) -> str:
        if isinstance(o, EncodedList):
            return o.to_json()
        return super().encode(o)
