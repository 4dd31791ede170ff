"""A draft model: a smaller model with the model's tokenizer proposes the tokens a pass verifies.

Owns: the draft's own runner and KV pool (beside the model's, sized by the same budget), one
scratch sequence per request that follows the request's tokens (the KV of what both agree on is
kept from pass to pass; what the verification rejected is cut off), and proposing: k passes of
the draft, each choosing its most likely token under the request's own processors (a sure
proposal, so the verification's rule keeps the answer exactly the model's, greedy or sampled),
with the draft's probability of it, for the views. The tokenizer check (same vocabulary, so a
proposed id means the same text to both models).
Must not know: the batch, the model's passes, Django.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch

from inference.config import EngineConfig
from inference.core.block_manager import BlockManager
from inference.core.scheduler import Chunk
from inference.core.sequence import Sequence
from inference.models.loader import LoadedModel
from inference.models.runner import ModelRunner
from inference.sampling.logits import apply_processors, build_processors, penalized_ids
from inference.sampling.sampler import argmax
from inference.sampling_params import SamplingParams
from inference.speculative.proposers import Proposal

SMOOTHING = 0.3  # weight of the newest draft pass in its running cost


def check_same_tokenizer(model: LoadedModel, draft: LoadedModel) -> None:
    """A ValueError unless both tokenizers map the same text pieces to the same ids."""
    if model.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ValueError(
            f"speculative={draft.name!r}: the draft model's tokenizer is not {model.name}'s "
            "(a proposed token id would mean another text)"
        )


class DraftModel:
    """A loaded draft and its KV pool; `proposer(params, prompt_ids)` for each request."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig, vocab_size: int) -> None:
        self.name = loaded.name
        self.runner = ModelRunner(loaded, config)
        self.block_manager = BlockManager(self.runner.pool.num_blocks, config.block_size)
        self.vocab_size = vocab_size  # the model's logits width: a draft token past it is never proposed
        self.ms_per_token = 0.0  # a draft pass, averaged over recent ones

    def proposer(self, params: SamplingParams, prompt_ids: list[int]) -> DraftProposer:
        return DraftProposer(self, replace(params, use_prefix_cache=False), list(prompt_ids))

    def forward(self, seq: Sequence) -> torch.Tensor:
        """The draft's float32 logits (vocab,) after `seq`'s last token (computing what lacks KV)."""
        start = seq.num_computed_tokens
        self.block_manager.append_slots(seq, seq.num_tokens)
        num_tokens = seq.num_tokens - start
        started = time.perf_counter()
        logits = self.runner.run([Chunk(seq, start, num_tokens, True, "decode" if num_tokens == 1 else "prefill")])
        if num_tokens == 1:
            ms = (time.perf_counter() - started) * 1000
            self.ms_per_token = ms if not self.ms_per_token else (1 - SMOOTHING) * self.ms_per_token + SMOOTHING * ms
        seq.num_computed_tokens = seq.num_tokens
        return logits.logits[0]


@dataclass
class DraftProposer:
    draft: DraftModel
    params: SamplingParams
    prompt_ids: list[int]
    seq: Sequence | None = None
    kind: str = "draft"
    processors: list = field(init=False, repr=False)  # the request's, on the draft's logits

    def __post_init__(self) -> None:
        self.processors = build_processors(self.params)

    @property
    def name(self) -> str:
        return self.draft.name

    @property
    def draft_ms(self) -> float:
        """What one proposed token costs (a draft pass)."""
        return self.draft.ms_per_token

    def propose(self, token_ids: list[int], num_generated: int, max_tokens: int) -> Proposal | None:
        if max_tokens <= 0 or not self._follow(token_ids):
            return None
        processors, seq = self.processors, self.seq
        proposed, probs = [], []
        for _ in range(max_tokens):
            if not self.draft.block_manager.can_append(seq, seq.num_tokens):
                break
            logits = self.draft.forward(seq)[: self.draft.vocab_size][None]  # (1, vocab)
            if processors:
                context = torch.tensor([penalized_ids(seq.token_ids, seq.num_prompt_tokens, self.params)])
                logits = apply_processors(processors, logits, context)
            token_id = int(argmax(logits)[0])
            probs.append(float(torch.softmax(logits[0], dim=-1)[token_id]))
            proposed.append(token_id)
            seq.append_token(token_id)
        return Proposal(proposed, probs, self.name, self.kind) if proposed else None

    def _follow(self, token_ids: list[int]) -> bool:
        """The scratch sequence takes the request's tokens, keeping the KV of the prefix both
        share; False when the draft's pool has no room for them."""
        bm = self.draft.block_manager
        if self.seq is None:
            self.seq = Sequence(list(token_ids), self.params, num_prompt_tokens=len(self.prompt_ids))
            if not bm.can_allocate(self.seq):
                self.seq = None
                return False
            bm.allocate(self.seq)
            return True
        seq = self.seq
        common = 0
        limit = min(seq.num_computed_tokens, len(token_ids) - 1)  # the last token's pass gives the first proposal
        while common < limit and seq.token_ids[common] == token_ids[common]:
            common += 1
        seq.token_ids = list(token_ids)
        seq.num_computed_tokens = common
        bm.trim(seq)
        return bm.can_append(seq, seq.num_tokens)

    def close(self) -> None:
        """Gives the scratch sequence's blocks back (the request ended)."""
        if self.seq is not None:
            self.draft.block_manager.deallocate(self.seq)
            self.seq = None
