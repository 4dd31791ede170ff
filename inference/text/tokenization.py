"""Token ids <-> pieces <-> exact bytes, and UTF-8-safe streaming of generated text.

Owns: what each token id stands for (`TokenInfo`: its text alone, its raw bytes, whether it
is special), prompt encoding without added special tokens, the one rule for the BOS token raw
text starts with (`bos_for_raw_text`), and `IncrementalDetokenizer`,
which turns a stream of ids into text increments that never split a UTF-8 character.
Must not know: models, sampling, chat templates (their output is already text here).

A token's bytes come from one table per tokenizer, built once and cached, because the
engine asks for them on every decode step. Three vocabularies are understood:
byte-level BPE (GPT-2 style: every byte is mapped to a printable character, which the table
maps back), SentencePiece (`▁` is a space, `<0xNN>` is a byte fallback) and, for anything
else, the tokenizer's own `decode([id])`.
"""

from __future__ import annotations

import codecs
import json
import re
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

_SENTENCEPIECE_SPACE = "\u2581"  # "▁"
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class Tokenizer(Protocol):
    """The slice of a Hugging Face tokenizer this module relies on."""

    added_tokens_decoder: dict[int, Any]

    def __len__(self) -> int: ...
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...
    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]: ...


@dataclass(frozen=True)
class TokenInfo:
    """One token: `piece` is its text alone (may hold U+FFFD for part of a character),
    `bytes` its exact raw bytes (concatenating them rebuilds the UTF-8 text)."""

    id: int
    piece: str
    bytes: bytes
    is_special: bool

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "piece": self.piece, "bytes": self.bytes.hex(), "is_special": self.is_special}


@dataclass(frozen=True)
class TokenTable:
    """Per-token bytes, pieces and special flags for a whole vocabulary.

    Ids past the table (models often pad their embedding matrix beyond the tokenizer's
    vocabulary) stand for no text: empty bytes and piece.
    """

    token_bytes: tuple[bytes, ...]
    pieces: tuple[str, ...]
    special_ids: frozenset[int]
    scheme: str  # "byte_level", "sentencepiece" or "decode"

    def bytes_of(self, token_id: int) -> bytes:
        _check_id(token_id)
        return self.token_bytes[token_id] if token_id < len(self.token_bytes) else b""

    def piece_of(self, token_id: int) -> str:
        _check_id(token_id)
        return self.pieces[token_id] if token_id < len(self.pieces) else ""

    def info(self, token_id: int) -> TokenInfo:
        return TokenInfo(token_id, self.piece_of(token_id), self.bytes_of(token_id), token_id in self.special_ids)


def _check_id(token_id: int) -> None:
    if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
        raise ValueError(f"token id {token_id!r} must be a non-negative integer")


_tables: "weakref.WeakKeyDictionary[Any, TokenTable]" = weakref.WeakKeyDictionary()
_tables_lock = threading.Lock()


# A worker builds its prompts on its task threads, several at once. A transformers fast
# tokenizer is one Rust object whose truncation and padding settings each encode call checks and
# may reset (a tokenizer.json that ships with truncation on): a second thread's call meanwhile
# fails with "Already borrowed". One encode at a time: 8-10 ms for a 6,000-token chat.
_encode_lock = threading.Lock()


def token_table(tokenizer: Tokenizer) -> TokenTable:
    """The tokenizer's table, built on first use and kept as long as the tokenizer lives."""
    with _tables_lock:
        table = _tables.get(tokenizer)
        if table is None:
            table = _build_table(tokenizer)
            _tables[tokenizer] = table
        return table


def token_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    """The exact bytes `token_id` stands for."""
    return token_table(tokenizer).bytes_of(token_id)


def token_infos(tokenizer: Tokenizer, ids: Iterable[int]) -> list[TokenInfo]:
    table = token_table(tokenizer)
    return [table.info(i) for i in ids]


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    """Ids for `text` without added BOS/EOS (a rendered chat template already has them).

    Special-token strings inside `text` (e.g. `<|im_start|>`) become their special ids,
    exactly as `apply_chat_template(..., tokenize=True)` encodes a rendered prompt.
    """
    if not isinstance(text, str):
        raise ValueError(f"text to tokenize must be a string, not {type(text).__name__}")
    with _encode_lock:
        return list(tokenizer.encode(text, add_special_tokens=False))


def tokenize(tokenizer: Tokenizer, text: str) -> list[TokenInfo]:
    return token_infos(tokenizer, encode(tokenizer, text))


def bos_for_raw_text(tokenizer: Tokenizer, text: str) -> TokenInfo | None:
    """The BOS token raw text (no chat template: a completion, text to score) must start with, or
    None. The rule is the tokenizer's own: it adds BOS when `tokenizer(text)` does, i.e. when its
    `add_bos_token` says so (from tokenizer_config.json, or from a GGUF's
    `tokenizer.ggml.add_bos_token` when the file was converted); it is read by encoding `text`
    both ways, so it is exactly what the model was trained to see first, where a chat template's
    `{{ bos_token }}` puts it. Nothing for empty text (token ids sent as they are), nor for text
    already starting with BOS. The callers put the token first and show it in the prompt."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if not text or bos_id is None:
        return None
    with _encode_lock:
        with_special = tokenizer.encode(text, add_special_tokens=True)
    without = encode(tokenizer, text)
    if with_special[:1] != [bos_id] or without[:1] == [bos_id]:
        return None
    return token_table(tokenizer).info(bos_id)


def _build_table(tokenizer: Tokenizer) -> TokenTable:
    added = dict(tokenizer.added_tokens_decoder)
    size = max([len(tokenizer), *(i + 1 for i in added)])
    strings = tokenizer.convert_ids_to_tokens(list(range(size)))
    scheme = _vocabulary_scheme(tokenizer, strings)
    if scheme == "byte_level":
        raw = [_byte_level_bytes(s or "") for s in strings]
    elif scheme == "sentencepiece":
        raw = [_sentencepiece_bytes(s or "") for s in strings]
    else:
        raw = [tokenizer.decode([i], skip_special_tokens=False).encode("utf-8") for i in range(size)]
    if scheme != "byte_level":
        # byte-level decoders map added tokens through the byte table like any other token
        # (`_byte_level_bytes` covers both); the other decoders emit their text as is
        for token_id, token in added.items():
            raw[token_id] = token.content.encode("utf-8")
    special_ids = frozenset(i for i, token in added.items() if token.special)
    pieces = tuple(b.decode("utf-8", errors="replace") for b in raw)
    return TokenTable(tuple(raw), pieces, special_ids, scheme)


def _vocabulary_scheme(tokenizer: Tokenizer, strings: Sequence[str | None]) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and backend.decoder is not None:
        decoder = json.loads(backend.to_str()).get("decoder") or {}
        kinds = _decoder_kinds(decoder)
        if "ByteLevel" in kinds:
            return "byte_level"
        if kinds & {"ByteFallback", "Metaspace"} or _replaces_sentencepiece_space(decoder):
            return "sentencepiece"
        return "decode"
    # slow (Python / sentencepiece) tokenizers: judge by the vocabulary itself
    sample = [s for s in strings[:5000] if s]
    if any(_BYTE_FALLBACK.match(s) or s.startswith(_SENTENCEPIECE_SPACE) for s in sample):
        return "sentencepiece"
    return "decode"


def _decoder_kinds(decoder: dict) -> set[str]:
    kinds = {decoder.get("type", "")}
    for child in decoder.get("decoders") or ():
        kinds |= _decoder_kinds(child)
    return kinds


def _replaces_sentencepiece_space(decoder: dict) -> bool:
    children = decoder.get("decoders") or [decoder]
    return any(
        c.get("type") == "Replace" and c.get("pattern", {}).get("String") == _SENTENCEPIECE_SPACE for c in children
    )


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte's printable stand-in character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    unprintable = [b for b in range(256) if b not in printable]
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(unprintable)}}


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {char: b for b, char in bytes_to_unicode().items()}


def _byte_level_bytes(token: str) -> bytes:
    # Same rule as the `tokenizers` ByteLevel decoder: a token made only of stand-in
    # characters is mapped back byte by byte; any other token is its own UTF-8 text.
    table = _unicode_to_byte()
    try:
        return bytes(table[c] for c in token)
    except KeyError:
        return token.encode("utf-8")


def _sentencepiece_bytes(token: str) -> bytes:
    fallback = _BYTE_FALLBACK.match(token)
    if fallback:
        return bytes([int(fallback.group(1), 16)])
    return token.replace(_SENTENCEPIECE_SPACE, " ").encode("utf-8")


class IncrementalDetokenizer:
    """Turns generated ids into text increments that never end inside a UTF-8 character.

    Bytes of a character split across tokens (emoji, CJK) are held back until it is
    complete; `flush()` emits whatever is left (an incomplete tail as U+FFFD). For byte-level
    tokenizers the concatenated increments equal `tokenizer.decode(all_ids)`. Each `push`
    costs time proportional to its own token, not to the text so far.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._table = token_table(tokenizer)
        self._skip_special_tokens = skip_special_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []

    def push(self, token_id: int) -> str:
        """Add one token; returns the newly completed text (often "", never broken UTF-8)."""
        if self._skip_special_tokens and token_id in self._table.special_ids:
            return ""
        delta = self._decoder.decode(self._table.bytes_of(token_id))
        self._parts.append(delta)
        return delta

    def flush(self) -> str:
        """End of stream: returns the held-back tail (U+FFFD for an incomplete character)."""
        delta = self._decoder.decode(b"", final=True)
        self._parts.append(delta)
        return delta

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        text = "".join(self._parts)
        self._parts = [text]
        return text


def text_deltas(tokenizer: Tokenizer, token_ids: Sequence[int], text: str) -> tuple[str, ...]:
    """Each token's share of `text`, the answer decoded from `token_ids` (maybe cut short at a
    stop string): the increments `IncrementalDetokenizer` gives, the last one with the flushed
    tail, trimmed so that they add up to `text` (tokens past the cut get "")."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    deltas = [detokenizer.push(token_id) for token_id in token_ids]
    if deltas:
        deltas[-1] += detokenizer.flush()
    trimmed, used = [], 0
    for delta in deltas:
        delta = delta[: max(0, len(text) - used)]
        trimmed.append(delta)
        used += len(delta)
    return tuple(trimmed)
