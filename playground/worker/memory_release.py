"""Giving a long prompt's memory back: the engine loop's observer that returns the freed heap to
the OS once the batch is idle after long prompts.

Owns: the rule. Prompts of `LONG_PROMPT_TOKENS` or more (summed since the last release) leave
their renders, token records and the prefill's activations freed but resident: glibc hands pages
back only from the top of a heap, and the task thread and the engine thread each allocate from
an arena of their own. When the batch next has no request, `release_free_memory()` (malloc_trim)
returns them; a trim takes about a millisecond, and an idle loop has nothing better to do. Every
other report goes on to the observer it wraps.
Must not know: sockets, the ORM, how the engine computes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inference.events import Finished
from inference.models.memory import release_free_memory

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.engine_core import BatchStep
    from inference.events import Event
    from playground.worker.serve_loop import LoopObserver

LONG_PROMPT_TOKENS = 4096  # prompt tokens since the last release that make the next idle moment release


class ReleaseAfterLongPrompts:
    """A `LoopObserver` that releases freed memory when the batch goes idle after long prompts."""

    def __init__(self, inner: LoopObserver | None = None, long_prompt_tokens: int = LONG_PROMPT_TOKENS) -> None:
        self.inner = inner
        self.long_prompt_tokens = long_prompt_tokens
        self.prompt_tokens = 0  # of the requests finished since the last release
        self.num_releases = 0

    def on_event(self, request_id: int, event: Event) -> None:
        if isinstance(event, Finished):
            self.prompt_tokens += event.num_prompt_tokens
        if self.inner is not None:
            self.inner.on_event(request_id, event)

    def after_step(
        self, engine: Engine, step: BatchStep | None, generation_of: dict[int, int], num_requests: int
    ) -> None:
        if self.inner is not None:
            self.inner.after_step(engine, step, generation_of, num_requests)
        if num_requests == 0 and self.prompt_tokens >= self.long_prompt_tokens:
            self.prompt_tokens = 0
            self.num_releases += 1
            release_free_memory()
