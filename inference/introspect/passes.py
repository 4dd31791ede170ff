"""Inspection passes through the served path: a finished generation's logits recomputed by the
same runner, kernels and paged KV pool that served it (so the views equal the streamed numbers).

Owns: the scratch sequence of each pass (blocks of its own, shared with no one, freed after) and
its pacing. A pass runs as chunks of at most `chunk_tokens` (the engine's token budget, as a
prompt's prefill runs) and calls `pace()` after each: the worker's loop runs a step of the batch
there (`ServeLoop`), so an 8,000-token prompt's logprobs or a lens deep in a long chat hold no
one's next token longer than one chunk. Alone (a benchmark, a test) `pace` does nothing. Must not
know: the batch, requests, the worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from inference.core.block_manager import BlockManager
from inference.core.scheduler import Chunk
from inference.core.sequence import Sequence
from inference.models.runner import ModelRunner
from inference.sampling_params import SamplingParams


class InspectionPasses:
    def __init__(self, runner: ModelRunner, block_manager: BlockManager, chunk_tokens: int) -> None:
        self.runner, self.block_manager, self.chunk_tokens = runner, block_manager, chunk_tokens
        self.pace: Callable[[], None] = lambda: None

    def teacher_force(self, prompt_ids: list[int], answer_ids: list[int]) -> torch.Tensor:
        """float32 logits (len(answer_ids) + 1, vocab) predicting each answer token and the one
        after, computed as a stream computes them: the prompt prefilled (in chunks), then one
        decode step per answer token (the served path's kernels and rounding)."""
        with self._scratch(prompt_ids, len(answer_ids)) as seq:
            rows = [self._prefill(seq)]  # (vocab,) each
            for token_id in answer_ids:
                seq.num_computed_tokens = seq.num_tokens
                seq.append_token(token_id)
                self.block_manager.append_slots(seq, seq.num_tokens)
                rows.append(self.runner.run([Chunk(seq, seq.num_tokens - 1, 1, True, "decode")]).logits[0])
                self.pace()
        return torch.stack(rows)

    def score(self, token_ids: list[int], read: Callable[[int, torch.Tensor], None], max_rows: int = 256) -> None:
        """Every position's float32 logits through the served path (row i predicts token i + 1),
        handed to `read(first_position, logits (n, vocab))` in chunks of at most `max_rows`
        positions (a long prompt's whole logits would not fit: 2,000 x 152k x 4 bytes)."""
        with self._scratch(token_ids) as seq:
            for start in range(0, seq.num_tokens, min(max_rows, self.chunk_tokens)):
                num_tokens = min(max_rows, self.chunk_tokens, seq.num_tokens - start)
                is_last = start + num_tokens == seq.num_tokens
                chunk = Chunk(seq, start, num_tokens, is_last, "prefill", is_scored=True)
                read(start, self.runner.run([chunk]).logits)
                self.pace()

    def read_layers(self, token_ids: list[int]) -> torch.Tensor:
        """The logit lens at the last of `token_ids`: float32 (L + 1, vocab), read after the
        embedding and after each layer of the served pass; the last row is its own logits."""
        with self._scratch(token_ids) as seq:
            self._prefill(seq, up_to=seq.num_tokens - 1)  # context: the lens reads the last token's pass
            chunk = Chunk(seq, seq.num_tokens - 1, 1, True, "prefill")
            return self.runner.run_layers([chunk])[:, 0]

    def _prefill(self, seq: Sequence, up_to: int | None = None) -> torch.Tensor | None:
        """Runs `seq`'s tokens [0, up_to) in chunks, pacing after each; the logits (vocab,) after
        the last one when it reaches the sequence's end, else None."""
        end = seq.num_tokens if up_to is None else up_to
        logits = None
        for start in range(0, end, self.chunk_tokens):
            num_tokens = min(self.chunk_tokens, end - start)
            is_last = start + num_tokens == seq.num_tokens
            output = self.runner.run([Chunk(seq, start, num_tokens, is_last, "prefill")])
            logits = output.logits[0] if is_last else None
            self.pace()
        return logits

    @contextmanager
    def _scratch(self, token_ids: list[int], num_more: int = 0) -> Iterator[Sequence]:
        """A sequence of `token_ids` in blocks of its own (room for `num_more` tokens), shared
        with no one and freed after: an inspection's."""
        seq = Sequence(list(token_ids), SamplingParams(use_prefix_cache=False))
        num_blocks = seq.num_blocks_needed(self.block_manager.block_size, seq.num_tokens + num_more)
        if num_blocks > self.block_manager.num_free_blocks:
            raise ValueError("the KV pool has no room for this replay now: try again when the batch is smaller")
        self.block_manager.allocate(seq)
        # The `num_more` tokens' blocks are taken now, not when they are written: `pace()` steps
        # the batch between chunks, and its requests would take the free blocks checked above
        # (teacher forcing then found the free list empty half-way, a KeyError).
        self.block_manager.append_slots(seq, seq.num_tokens + num_more)
        try:
            yield seq
        finally:
            self.block_manager.deallocate(seq)
