"""The reasoning split: which parts of a reasoning model's answer are `<think>` blocks.

Owns the one rule the chat, the explorer and the API all use (the UI receives the segments
from the server and never splits text itself): text inside `<think>` ... `</think>` is
reasoning, the rest is the answer; an unclosed `<think>` (still streaming) runs to the end;
text before a `</think>` that no `<think>` opened is reasoning too, because DeepSeek-R1's
template ends the prompt with `<think>` and the answer begins inside it.
Must not know: tokenizers, models, Django.
"""

from __future__ import annotations

import bisect
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
    return ReasoningStream(text, starts_in_reasoning=starts_in_reasoning).segments()


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
    return ReasoningStream(text, starts_in_reasoning=starts_in_reasoning).segments_for_browser()


RunKind = Literal["reasoning", "answer", "undecided"]


class ReasoningStream:
    """An answer's text as it streams, with its segments kept up to date: each look at them
    scans only what came since the last one (a tag cut between two deltas is found once its end
    arrives), so a stream's segments cost time linear in the answer, not quadratic.

    The state: the segments that can no longer change (`_closed`), then the run being written
    from `_run_start` on, which is reasoning, answer, or undecided (no tag seen yet: answer for
    now, but a `</think>` coming first makes it reasoning, R1's case).
    """

    def __init__(self, text: str = "", *, starts_in_reasoning: bool = False) -> None:
        self.starts_in_reasoning = starts_in_reasoning
        self.text = ""
        self._reset()
        self.text = text

    def append(self, delta: str) -> None:
        self.text += delta

    def set_text(self, text: str) -> None:
        """The answer is `text` now: scanned on from where it was if it only grew, else anew."""
        if not text.startswith(self.text):
            self._reset()
        self.text = text

    def _reset(self) -> None:
        self._closed: list[Segment] = []
        self._start_run("reasoning" if self.starts_in_reasoning else "undecided", 0)
        self._astral: list[int] = []  # where the characters outside the BMP are (two UTF-16 units)
        self._num_indexed = 0  # the characters looked at for `_astral`

    def segments(self) -> list[Segment]:
        self._scan()
        end = len(self.text)
        if self._mode == "reasoning":
            return [*self._closed, Segment("reasoning", self._run_start, end, is_open=True)]
        if not self._run_has_text:  # only what came since the last look is looked at
            self._run_has_text = bool(self.text[self._num_checked : end].strip())
            self._num_checked = end
        return [*self._closed, Segment("answer", self._run_start, end)] if self._run_has_text else self._closed[:]

    def segments_for_browser(self) -> list[dict[str, Any]]:
        """`segments` with offsets in UTF-16 code units (see `segments_for_browser`)."""
        segments = self.segments()
        self._index_astral()
        if not self._astral:
            return [s.to_dict() for s in segments]
        return [{**s.to_dict(), "start": self._utf16(s.start), "end": self._utf16(s.end)} for s in segments]

    def _start_run(self, mode: RunKind, start: int) -> None:
        self._mode, self._run_start = mode, start
        self._num_scanned = start  # tags that begin before this were looked for
        self._run_has_text, self._num_checked = False, start  # an answer run: non-whitespace seen so far

    def _scan(self) -> None:
        text = self.text
        while True:
            if self._mode == "reasoning":
                close_at = text.find(THINK_CLOSE, self._num_scanned)
                if close_at < 0:
                    break
                self._closed.append(Segment("reasoning", self._run_start, close_at))
                self._start_run("answer", close_at + len(THINK_CLOSE))
                continue
            open_at = text.find(THINK_OPEN, self._num_scanned)
            close_at = text.find(THINK_CLOSE, self._num_scanned) if self._mode == "undecided" else -1
            if close_at >= 0 and (open_at < 0 or close_at < open_at):  # no `<think>` opened it: R1's prompt did
                self._closed.append(Segment("reasoning", 0, close_at))
                self._start_run("answer", close_at + len(THINK_CLOSE))
                continue
            if open_at < 0:
                break
            if text[self._run_start : open_at].strip():  # whitespace between blocks is no answer run
                self._closed.append(Segment("answer", self._run_start, open_at))
            self._start_run("reasoning", open_at + len(THINK_OPEN))
        # A tag may have begun in the last few characters; the rest holds none.
        self._num_scanned = max(self._run_start, len(text) - len(THINK_CLOSE) + 1)

    def _index_astral(self) -> None:
        new = self.text[self._num_indexed :]
        if not new.isascii():
            self._astral += [self._num_indexed + i for i, ch in enumerate(new) if ord(ch) > 0xFFFF]
        self._num_indexed = len(self.text)

    def _utf16(self, index: int) -> int:
        return index + bisect.bisect_left(self._astral, index)
