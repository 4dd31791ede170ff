"""The reasoning split kept incrementally (`ReasoningStream`) gives, after any chunking of the
answer, the segments the whole-text rule gives: checked against that rule as it was written
before (a reference copy, here) over random texts made of tags, cut tags, whitespace and emoji."""

from __future__ import annotations

import random
from typing import Any

import pytest

from inference.text.reasoning import THINK_CLOSE, THINK_OPEN, ReasoningStream, segments_for_browser, split_segments


def reference_segments(text: str, starts_in_reasoning: bool) -> list[tuple[str, int, int, bool]]:
    segments: list[tuple[str, int, int, bool]] = []

    def answer(start: int, end: int) -> None:
        if text[start:end].strip():
            segments.append(("answer", start, end, False))

    def reasoning(start: int) -> int:
        close_at = text.find(THINK_CLOSE, start)
        is_open = close_at < 0
        segments.append(("reasoning", start, len(text) if is_open else close_at, is_open))
        return len(text) if is_open else close_at + len(THINK_CLOSE)

    pos = 0
    first_open, first_close = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if starts_in_reasoning or (first_close >= 0 and (first_open < 0 or first_close < first_open)):
        pos = reasoning(0)
    while pos < len(text):
        open_at = text.find(THINK_OPEN, pos)
        if open_at < 0:
            answer(pos, len(text))
            break
        answer(pos, open_at)
        pos = reasoning(open_at + len(THINK_OPEN))
    return segments


def reference_for_browser(text: str, starts_in_reasoning: bool) -> list[dict[str, Any]]:
    utf16 = [0]
    for ch in text:
        utf16.append(utf16[-1] + (2 if ord(ch) > 0xFFFF else 1))
    return [
        {"kind": kind, "start": utf16[start], "end": utf16[end], "is_open": is_open}
        for kind, start, end, is_open in reference_segments(text, starts_in_reasoning)
    ]


PIECES = [THINK_OPEN, THINK_CLOSE, "<think", ">", "</", "think>", " ", "\n", "a", "word", "é", "😀", "<", "/"]


def as_tuples(stream: ReasoningStream) -> list[tuple[str, int, int, bool]]:
    return [(s.kind, s.start, s.end, s.is_open) for s in stream.segments()]


@pytest.mark.parametrize("seed", range(300))
def test_chunked_stream_matches_the_whole_text_rule(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 40)))
    starts_in_reasoning = rng.random() < 0.3
    stream = ReasoningStream(starts_in_reasoning=starts_in_reasoning)
    pos = 0
    while pos < len(text):
        end = min(len(text), pos + rng.randint(1, 6))
        stream.append(text[pos:end])
        pos = end
        if rng.random() < 0.5:  # looked at between some deltas, not all
            prefix = text[:pos]
            assert as_tuples(stream) == reference_segments(prefix, starts_in_reasoning)
            assert stream.segments_for_browser() == reference_for_browser(prefix, starts_in_reasoning)
    assert as_tuples(stream) == reference_segments(text, starts_in_reasoning)
    assert stream.segments_for_browser() == reference_for_browser(text, starts_in_reasoning)
    assert [
        (s.kind, s.start, s.end, s.is_open) for s in split_segments(text, starts_in_reasoning=starts_in_reasoning)
    ] == (reference_segments(text, starts_in_reasoning))
    assert segments_for_browser(text, starts_in_reasoning=starts_in_reasoning) == reference_for_browser(
        text, starts_in_reasoning
    )


def test_set_text_scans_on_when_the_text_grew_and_anew_when_it_changed() -> None:
    stream = ReasoningStream("<think>a")
    assert as_tuples(stream) == [("reasoning", 7, 8, True)]
    stream.set_text("<think>ab</think> x")
    assert as_tuples(stream) == [("reasoning", 7, 9, False), ("answer", 17, 19, False)]
    stream.set_text("plain")  # a beam search's best beam changed
    assert as_tuples(stream) == [("answer", 0, 5, False)]
