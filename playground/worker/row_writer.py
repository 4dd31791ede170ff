"""Writes one running generation's row and its answer message.

Owns: what a save of the row may overwrite (only a row still `running`: a watchdog that declared
it lost wins), the partial answer saved at intervals (the text every `SAVE_PARTIAL_EVERY_S`, the
growing steps list less often), the outcome's fields, and the recent-steps tail trimmed once the
row holds those steps. Must not know: the engine, the channel layer.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from django.utils import timezone

from inference.events import Finished
from playground import encoded_json
from playground.coord import recent_steps
from playground.encoded_json import EncodedList
from playground.models import Generation, Message
from playground.protocol import CommandError

logger = logging.getLogger(__name__)

SAVE_PARTIAL_EVERY_S = 1.0  # the answer's text: what a killed worker loses at most
# The saved steps are rewritten whole (a JSON list that grows with the answer), so saving them
# every second cost quadratic time: the fixed interval took a third of a task thread's time
# under 8 clients. They wait `len(steps) / STEPS_SAVED_PER_S` seconds (at least the text's
# interval), which keeps the total linear; the ones not saved yet are in Redis meanwhile
# (coord/recent_steps.py), where a re-attaching page reads them.
STEPS_SAVED_PER_S = 20.0


class RowWriter:
    """The saves of one generation's row; `answer_id` is its assistant message (chat only)."""

    def __init__(self, generation_id: int) -> None:
        self.generation_id = generation_id
        self.answer_id: int | None = None
        self.saved_at = self.steps_saved_at = time.monotonic()

    def save_partial(self, text: str, step_texts: list[str]) -> None:
        """The answer so far, if its interval has passed (the steps only at theirs)."""
        now = time.monotonic()
        if now - self.saved_at < SAVE_PARTIAL_EVERY_S:
            return
        fields: dict[str, Any] = {"text": text}
        if now - self.steps_saved_at >= max(SAVE_PARTIAL_EVERY_S, len(step_texts) / STEPS_SAVED_PER_S):
            fields["steps"] = EncodedList(step_texts)  # a reloaded page re-attaches from these and the tail
        self.save(**fields)
        self.save_answer(text)

    def save_outcome(self, fields: dict[str, Any], step_texts: list[str]) -> None:
        """The end: every step, the outcome's `fields` (`finished_fields` or `error_fields`)."""
        self.save(steps=EncodedList(step_texts), finished_at=timezone.now(), **fields)
        self.save_answer(fields["text"])

    def save(self, **fields: Any) -> None:
        """Updates the row while it is still running. Saved steps leave the recent-steps tail
        (after the save: a reader in between finds them in one or the other)."""
        for name in ("text", "prompt_text"):  # what the model wrote may hold U+0000: PostgreSQL refuses it
            if name in fields:
                fields[name] = encoded_json.without_nul(fields[name])
        num_updated = Generation.objects.filter(pk=self.generation_id, status=Generation.Status.RUNNING).update(
            **fields
        )
        self.saved_at = time.monotonic()
        if "steps" not in fields:
            return
        self.steps_saved_at = self.saved_at
        if num_updated:
            try:
                recent_steps.trim_saved(self.generation_id, len(fields["steps"]))
            except redis.RedisError:
                logger.warning("generation %s: the recent steps were not trimmed", self.generation_id, exc_info=True)

    def save_answer(self, text: str) -> None:
        if self.answer_id is not None:
            Message.objects.filter(pk=self.answer_id).update(content=encoded_json.without_nul(text))


def finished_fields(finished: Finished, stats: dict[str, Any]) -> dict[str, Any]:
    is_cancelled = finished.finish_reason == "cancelled"
    return {
        "status": Generation.Status.CANCELLED if is_cancelled else Generation.Status.FINISHED,
        "finish_reason": finished.finish_reason,
        "text": finished.text,
        "stats": stats,
        "num_prompt_tokens": finished.num_prompt_tokens,
        "num_cached_tokens": finished.num_cached_tokens,
        "num_generated_tokens": finished.num_generated_tokens,
        "prefill_ms": finished.prefill_ms,
        "ttft_ms": stats.get("ttft_ms"),
        "decode_tok_s": finished.decode_tok_s,
    }


def error_fields(error: CommandError, text: str) -> dict[str, Any]:
    return {
        "status": Generation.Status.ERROR,
        "finish_reason": "error",
        "text": text,
        "error_code": error.code,
        "error_message": error.message,
    }
