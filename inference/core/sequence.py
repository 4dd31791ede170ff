"""One request's state as the scheduler and block manager see it: token ids, how many of them
have KV in the cache, which KV blocks hold them, and where it is in its life.

Owns: counts and status only (no tensors, no text). The engine keeps the rest of a request
(sampler, detokenizer, stop strings) beside it. Must not know: torch, models, Django.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum

from inference.sampling_params import SamplingParams

_next_id = itertools.count()


class SequenceStatus(Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to recompute
    RUNNING = "running"  # holds KV blocks; prefilling in chunks or decoding
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """`token_ids` = prompt + generated. The KV of `token_ids[:num_computed_tokens]` is in
    the cache; the next forward pass computes from there. While running, the last token never
    has KV yet: it is the input of the next step."""

    token_ids: list[int]
    params: SamplingParams
    num_prompt_tokens: int = 0
    seq_id: int = field(default_factory=lambda: next(_next_id))
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # of the prompt, reused from the prefix cache at admission
    num_imported_tokens: int = 0  # KV computed elsewhere (a prefill worker's handoff), loaded at admission
    block_table: list[int] = field(default_factory=list)
    num_preemptions: int = 0
    arrived_at: float = field(default_factory=time.perf_counter)
    first_scheduled_at: float | None = None
    # Runs of positions computed together or not at all: an image's tokens (its pixels go through
    # the vision tower whole). A chunk never ends inside one.
    atomic_spans: tuple[tuple[int, int], ...] = ()
    # (start, end, key): positions whose prefix-cache key is not their token id (an image's
    # positions carry its content hash: every image is the same token id repeated).
    key_overrides: tuple[tuple[int, int, int], ...] = ()
    # Sequences scheduled as one: beam search's beams advance together, so a preemption takes
    # them all and they are admitted together (a shared list; None: on its own).
    group: list[Sequence] | None = None
    # Places in the batch this sequence holds: a beam search or parallel-sampling leader holds
    # one for each sequence it forks into after its prefill, so the forks always fit.
    num_slots: int = 1
    # Who asked (a browser session, an API key): prefill budget is shared fairly between clients.
    client: str = ""
    # Proposed tokens (speculative decoding) at the end of `token_ids`, there only between their
    # proposal and their verification in one step: the pass computes them like any other, but
    # only those the model itself would have chosen stay (`drop_drafts`, then appended again).
    num_draft_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise ValueError("a sequence needs at least one token")
        self.num_prompt_tokens = self.num_prompt_tokens or len(self.token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than one token lacks KV: the prompt (or a preempted request's recompute); proposed
        tokens to verify do not count."""
        return self.num_uncomputed_tokens - self.num_draft_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def num_blocks_needed(self, block_size: int, num_tokens: int | None = None) -> int:
        """Blocks that hold the KV of the first `num_tokens` tokens (default: all of them)."""
        n = self.num_tokens if num_tokens is None else num_tokens
        return -(-n // block_size)

    @property
    def uses_prefix_cache(self) -> bool:
        """Shares computed blocks with other requests: not without a KV cache (its KV is thrown
        away and recomputed every step)."""
        return self.params.use_prefix_cache and self.params.use_kv_cache

    @property
    def is_idle(self) -> bool:
        """Every token has KV: nothing to compute until a token is appended (a beam waiting
        for its siblings' logits before the group advances)."""
        return self.num_uncomputed_tokens == 0

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def add_drafts(self, draft_ids: list[int]) -> None:
        """Proposed tokens after the last one, for this step's pass to verify."""
        if self.num_draft_tokens:
            raise ValueError(f"sequence {self.seq_id} already carries {self.num_draft_tokens} proposed tokens")
        self.token_ids.extend(draft_ids)
        self.num_draft_tokens = len(draft_ids)

    def drop_drafts(self, num_tokens: int | None = None) -> list[int]:
        """Takes the last `num_tokens` proposed tokens (default: all) off the sequence; them."""
        n = self.num_draft_tokens if num_tokens is None else max(0, min(num_tokens, self.num_draft_tokens))
        if n == 0:
            return []
        dropped = self.token_ids[-n:]
        del self.token_ids[-n:]
        self.num_draft_tokens -= n
        return dropped

    def key_ids(self, start: int, end: int) -> tuple[int, ...]:
        """The prefix-cache keys of positions start..end-1: token ids, image positions overridden."""
        keys = self.token_ids[start:end]
        for span_start, span_end, key in self.key_overrides:
            lo, hi = max(span_start, start), min(span_end, end)
            if lo < hi:
                keys = [*keys[: lo - start], *[key] * (hi - lo), *keys[hi - start :]]
        return tuple(keys)

    def chunk_end(self, start: int, end: int) -> int:
        """`end`, moved so that the chunk start..end-1 cuts no atomic span: back to the span's
        start when the chunk began before it, else forward to its end (over the budget)."""
        for span_start, span_end in self.atomic_spans:
            if span_start < end < span_end:
                return span_start if span_start > start else span_end
        return end

    def members(self) -> list[Sequence]:
        """The sequences scheduled with this one (itself included)."""
        return self.group if self.group is not None else [self]
