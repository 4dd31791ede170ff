"""The thinking budget: which generated tokens are reasoning, and the forced end of thinking.

Owns: following `<think>` blocks token by token (from each token's text, tags included, so a
tag spelled over several tokens is seen too), the count of reasoning tokens, and, once that
count reaches `max_thinking_tokens` while a block is open, the `</think>` token(s) the next
steps must take. The rule: a reasoning token is one generated while a block is open that
neither closes it nor was forced; the token(s) that open or close a block are the tag's.
Must not know: tokenizers, models, events (the engine passes token texts and the tag's ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inference.text.reasoning import THINK_CLOSE, THINK_OPEN


@dataclass
class ThinkingTracker:
    """One request's `<think>` state. `close_ids` is `</think>` in the model's vocabulary: one
    id when it has the tag as a token, else the tag's token sequence."""

    close_ids: tuple[int, ...]
    max_thinking_tokens: int | None = None  # None: unlimited
    is_open: bool = False  # inside a block now (the prompt may have opened it)
    num_reasoning_tokens: int = 0
    ended_by_budget: bool = False  # the budget forced a `</think>` at least once
    _pending: list[int] = field(default_factory=list)  # forced ids still to come, next first
    _tail: str = ""  # recent text that may be the start of a tag

    def __post_init__(self) -> None:
        if not self.close_ids:
            raise ValueError("close_ids is empty: `</think>` needs at least one token")

    def forced_token(self) -> int | None:
        """The id the next step must take, or None for the model's own choice."""
        is_over = self.max_thinking_tokens is not None and self.num_reasoning_tokens >= self.max_thinking_tokens
        if not self._pending and self.is_open and is_over:
            self._pending = list(self.close_ids)
            self.ended_by_budget = True
        return self._pending[0] if self._pending else None

    def push(self, text: str, *, is_forced: bool = False) -> bool:
        """Follow one generated token (`text`: its text alone); returns whether it is reasoning."""
        if is_forced:
            self._pending.pop(0)
        was_open = self.is_open
        self._follow_tags(text)
        is_reasoning = was_open and self.is_open and not is_forced
        self.num_reasoning_tokens += is_reasoning
        return is_reasoning

    def _follow_tags(self, text: str) -> None:
        self._tail += text
        while True:
            tag = THINK_CLOSE if self.is_open else THINK_OPEN
            at = self._tail.find(tag)
            if at < 0:
                break
            self.is_open = not self.is_open
            self._tail = self._tail[at + len(tag) :]
        # Only a tag's beginning matters later: keep fewer characters than the longer tag has.
        self._tail = self._tail[-(len(THINK_CLOSE) - 1) :]
