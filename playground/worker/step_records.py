"""The per-token records of one running generation, as its page gets them.

Owns: each step's record, encoded once (the message, Redis' recent-steps tail and every save of
the row carry that text as it is); buffering them into messages (`StepCoalescer`); keeping them
in the recent-steps tail before they are published (a page re-attaching in between reads them
there, coord/recent_steps.py); the stream's decode rate as the client got it.
Must not know: the row (`row_writer` saves it), the engine, how the answer's segments are made
(they come from the `segments` callable).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis

from inference.events import BeamStep, Step
from playground import encoded_json, protocol
from playground.coord import recent_steps
from playground.worker.publisher import StepCoalescer, flush_delay_s

logger = logging.getLogger(__name__)


class StepRecords:
    """The steps streamed so far (`texts`) and the ones waiting for their message."""

    def __init__(
        self,
        generation_id: int,
        send: Callable[[dict[str, Any]], None],
        segments: Callable[[], list[dict[str, Any]]],
        num_streams: Callable[[], int],
    ) -> None:
        self.generation_id = generation_id
        self.send, self.segments, self.num_streams = send, segments, num_streams
        self.is_beam_search = False  # beams carry their texts whole: no segments with their messages
        self.texts: list[str] = []  # each step record as JSON text, encoded once (encoded_json)
        self.coalescer = StepCoalescer(self._publish, max_delay_s=lambda: flush_delay_s(self.num_streams()))
        # When this stream got its first and latest token, on this worker's clock: the decode
        # rate the stream got (batched or not), which the engine's compute time alone is not.
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.num_timed_tokens = 0

    def add(self, event: Step | BeamStep) -> None:
        """Records a step (the answer's text already has it: a message sent now carries its segments)."""
        self.last_token_at = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = self.last_token_at
        self.num_timed_tokens += 1
        text = encoded_json.dumps(event.to_dict())
        self.texts.append(text)
        self.coalescer.add((event.index, text))

    def flush_due_at(self) -> float | None:
        return self.coalescer.flush_due_at()

    def flush(self) -> None:
        self.coalescer.flush()

    def forget_recent(self) -> None:
        """The row holds every step now: the recent-steps tail goes."""
        try:
            recent_steps.delete(self.generation_id)
        except redis.RedisError:
            logger.warning("generation %s: its recent steps expire on their own", self.generation_id, exc_info=True)

    def stream_rate(self) -> dict[str, Any]:
        """`stream_decode_ms` (first token to last, wall clock) and `stream_decode_tok_s` (tokens
        after the first over that time; None with fewer than two): what the client got."""
        if self.first_token_at is None:
            return {"stream_decode_ms": 0.0, "stream_decode_tok_s": None}
        seconds = self.last_token_at - self.first_token_at
        rate = (self.num_timed_tokens - 1) / seconds if self.num_timed_tokens > 1 and seconds > 0 else None
        return {"stream_decode_ms": seconds * 1000, "stream_decode_tok_s": rate}

    def _publish(self, steps: list[tuple[int, str]]) -> None:
        """Publishes buffered steps, each (its index, its record's JSON text)."""
        # Kept before they are published; the row has them after its next save.
        try:
            recent_steps.append(self.generation_id, steps)
        except redis.RedisError:
            logger.warning("generation %s: the recent steps could not be kept", self.generation_id, exc_info=True)
        segments = None if self.is_beam_search else self.segments()
        texts = [text for _, text in steps]
        self.send(protocol.generation_steps(self.generation_id, texts, is_beam=self.is_beam_search, segments=segments))
