"""JSON text made once and reused. A worker encodes each step record when it makes it; that
text goes to Redis (the recent steps), joined into the messages to the web process
(`protocol.generation_steps`), and joined into the row's saved steps, which are
rewritten whole as the answer grows: encoding them again at each save (the standard library
takes ~35 us a step, orjson ~2) was a large part of a task thread's time with 16 streams.

Owns: `dumps` (orjson: non-finite floats as null and U+0000 as U+2400, as browsers' JSON.parse
and PostgreSQL's jsonb need), `EncodedList` (a list whose JSON is its items' texts joined) and `Encoder` (the
steps field's encoder: writes an `EncodedList` as it is, anything else as `json` does).
Must not know: the ORM's models, the channel layer, sockets.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# PostgreSQL's jsonb cannot hold U+0000 ("unsupported Unicode escape sequence"): one step whose
# top-k had SmolLM2's <0x00> token (piece "\x00") failed its generation's save there. Every text
# made here writes it as U+2400 (the symbol for NUL): the events and the saved row alike; the
# token's exact bytes stay in `token_bytes` (hex). An escaped backslash before "u0000" is kept.
_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def dumps(value: Any) -> str:
    """`value` as compact JSON text; NaN and infinities become null, U+0000 becomes U+2400."""
    text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    return _NUL.sub(r"\1\\u2400", text) if "\\u0000" in text else text


def without_nul(text: str) -> str:
    """Text for a database column: U+0000 as U+2400, as in the JSON above (PostgreSQL's text
    columns refuse it too, and a model can sample a token that decodes to it)."""
    return text.replace("\x00", "\u2400") if "\x00" in text else text


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
