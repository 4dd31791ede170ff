"""The answer as it streams in: its text, its steps, and its split into `reasoning_content`
and `content` (the `<think>` rule of `inference.text.reasoning`, pure Python).

Owns: turning step records into text deltas that only ever grow (a `<think>` tag arriving in
pieces is held back until it is whole) and deciding which steps' logprobs belong to the
reasoning. Must not know: HTTP, the channel layer, OpenAI's shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inference.text.reasoning import THINK_CLOSE, THINK_OPEN, split_segments


@dataclass
class Delta:
    """What one batch of steps added: text and steps, each on its side of the split."""

    reasoning: str = ""
    content: str = ""
    reasoning_steps: list[dict[str, Any]] = field(default_factory=list)
    content_steps: list[dict[str, Any]] = field(default_factory=list)
    text_offset: int = 0  # where the first step's text starts in the answer

    def is_empty(self) -> bool:
        return not (self.reasoning or self.content or self.reasoning_steps or self.content_steps)


class Answer:
    """Accumulates step records. With `split_reasoning` false (legacy completions) all text is content."""

    def __init__(self, *, split_reasoning: bool = True, starts_in_reasoning: bool = False) -> None:
        self.split, self.starts_in_reasoning = split_reasoning, starts_in_reasoning
        self.text = ""
        self.steps: list[dict[str, Any]] = []
        self.offsets: list[int] = []  # where each step's text starts in `text`
        self._sent = ("", "")  # (reasoning, content) handed out so far

    def add(self, steps: list[dict[str, Any]]) -> Delta:
        first, text_offset = len(self.steps), len(self.text)
        for step in steps:
            self.offsets.append(len(self.text))
            self.steps.append(step)
            self.text += step.get("text_delta") or ""
        delta = self._delta(self._parts(self.text, final=False))
        delta.text_offset = text_offset
        for offset, step in zip(self.offsets[first:], self.steps[first:], strict=True):
            (delta.reasoning_steps if self.is_reasoning_at(offset) else delta.content_steps).append(step)
        return delta

    def finish(self, final_text: str) -> Delta:
        """The rest of the text once the generation ended (e.g. a held-back tag or stop-string tail)."""
        if final_text.startswith(self.text):
            self.text = final_text
        return self._delta(self._parts(self.text, final=True))

    def final_parts(self) -> tuple[str, str]:
        """(reasoning, content) of the whole answer (after `finish`): exactly what its deltas
        handed out, so a non-streamed answer's text is its stream's, byte for byte."""
        return self._sent

    def is_reasoning_at(self, offset: int) -> bool:
        """Whether the text at `offset` (tags included) lies in a `<think>` block."""
        if not self.split:
            return False
        for segment in split_segments(self.text, starts_in_reasoning=self.starts_in_reasoning):
            if segment.kind == "reasoning" and segment.start - len(THINK_OPEN) <= offset < segment.end + len(
                THINK_CLOSE
            ):
                return True
        return False

    def reasoning_steps(self) -> list[dict[str, Any]]:
        return [s for o, s in zip(self.offsets, self.steps, strict=True) if self.is_reasoning_at(o)]

    def content_steps(self) -> list[dict[str, Any]]:
        return [s for o, s in zip(self.offsets, self.steps, strict=True) if not self.is_reasoning_at(o)]

    def _parts(self, text: str, *, final: bool) -> tuple[str, str]:
        if not self.split:
            return "", text
        if not final:
            text = text[: len(text) - _partial_tag_length(text)]
        segments = split_segments(text, starts_in_reasoning=self.starts_in_reasoning)
        reasoning = "".join(text[s.start : s.end] for s in segments if s.kind == "reasoning")
        content = "".join(text[s.start : s.end] for s in segments if s.kind == "answer")
        return reasoning.lstrip(), content.lstrip()  # a prefix of what later text gives

    def _delta(self, parts: tuple[str, str]) -> Delta:
        sent_reasoning, sent_content = self._sent
        delta = Delta()
        if parts[0].startswith(sent_reasoning):
            delta.reasoning = parts[0][len(sent_reasoning) :]
            sent_reasoning = parts[0]
        if parts[1].startswith(sent_content):
            delta.content = parts[1][len(sent_content) :]
            sent_content = parts[1]
        self._sent = (sent_reasoning, sent_content)
        return delta


def _partial_tag_length(text: str) -> int:
    """How many trailing characters could be the start of a `<think>` or `</think>` tag."""
    for tag in (THINK_CLOSE, THINK_OPEN):
        for n in range(len(tag) - 1, 0, -1):
            if text.endswith(tag[:n]):
                return n
    return 0
