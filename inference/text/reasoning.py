"""The reasoning split: which parts of a reasoning model's answer are `<think>` blocks.

Owns the one rule the chat, the explorer and the API all use (the UI receives the segments
from the server and never splits text itself): text inside `<think>` ... `</think>` is
reasoning, the rest is the answer; an unclosed `<think>` (still streaming) runs to the end;
text before a `</think>` that no `<think>` opened is reasoning too, because DeepSeek-R1's
template ends the prompt with `<think>` and the answer begins inside it.
Must not know: tokenizers, models, Django.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class Segment:
    """`text[start:end]` (tags excluded) is one reasoning block or one run of answer text."""

    kind: Literal["reasoning", "answer"]
    start: int
    end: int
    is_open: bool = False  # a reasoning block whose `</think>` has not come (yet)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def prompt_opens_reasoning(prompt_text: str) -> bool:
    """Whether a rendered prompt leaves a `<think>` block open for the model to continue."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def split_segments(text: str, *, starts_in_reasoning: bool = False) -> list[Segment]:
    """The answer's segments in order; whitespace-only answer runs between blocks are dropped."""
    segments: list[Segment] = []
    pos = 0
    first_open, first_close = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if starts_in_reasoning or (first_close >= 0 and (first_open < 0 or first_close < first_open)):
        pos = _reasoning(text, 0, segments)
    while pos < len(text):
        open_at = text.find(THINK_OPEN, pos)
        if open_at < 0:
            _answer(text, pos, len(text), segments)
            break
        _answer(text, pos, open_at, segments)
        pos = _reasoning(text, open_at + len(THINK_OPEN), segments)
    return segments


def _answer(text: str, start: int, end: int, segments: list[Segment]) -> None:
    if text[start:end].strip():
        segments.append(Segment("answer", start, end))


def _reasoning(text: str, start: int, segments: list[Segment]) -> int:
    """Appends the block that starts at `start`; returns where the text after it begins."""
    close_at = text.find(THINK_CLOSE, start)
    is_open = close_at < 0
    segments.append(Segment("reasoning", start, len(text) if is_open else close_at, is_open))
    return len(text) if is_open else close_at + len(THINK_CLOSE)


def split_reasoning(text: str, *, starts_in_reasoning: bool = False) -> tuple[str, str]:
    """(reasoning, answer), each joined over its segments and stripped (what a chat template
    keeps of an earlier answer; the API hands out its streamed deltas instead, unstripped at
    the end)."""
    segments = split_segments(text, starts_in_reasoning=starts_in_reasoning)
    reasoning = "".join(text[s.start : s.end] for s in segments if s.kind == "reasoning")
    answer = "".join(text[s.start : s.end] for s in segments if s.kind == "answer")
    return reasoning.strip(), answer.strip()


def segments_for_browser(text: str, *, starts_in_reasoning: bool = False) -> list[dict[str, Any]]:
    """`split_segments` with offsets in UTF-16 code units, as JavaScript strings index them
    (a character outside the BMP, e.g. an emoji, is one Python index but two JS ones)."""
    segments = split_segments(text, starts_in_reasoning=starts_in_reasoning)
    if text.isascii():
        return [s.to_dict() for s in segments]
    utf16 = [0]
    for ch in text:
        utf16.append(utf16[-1] + (2 if ord(ch) > 0xFFFF else 1))
    return [{**s.to_dict(), "start": utf16[s.start], "end": utf16[s.end]} for s in segments]
