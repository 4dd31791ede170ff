"""The grammar stage of the sampler: which tokens a request's grammar allows next, on llguidance.

Owns: the llguidance tokenizer of a model's vocabulary (built once per tokenizer: ~3 s for
Qwen2.5's 151k tokens), compiled grammars (cached by spec and tokenizer), a request's
`GrammarMatcher` (its parser state: the mask of allowed tokens, advanced by each accepted token,
finished when the grammar is complete), and `apply_masks` (a step's rows masked at once, the
probability mass each mask removed). Why llguidance: docs/structured-outputs.md.
Must not know: models, caches, requests, events.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import torch

from inference.sampling import grammar_spec

_lock = threading.Lock()
_tokenizers: dict[tuple[int, int], tuple[Any, llguidance.LLTokenizer]] = {}  # (id(tokenizer), V) -> (it, ours)
# Each byte's 8 bits, lowest first, as an additive bias: 0 (allowed) or -inf (256, 8). A bitmask
# becomes its row's bias by one gather, added to the logits (exact: x + 0 = x). On a 2-core CPU for
# 8 rows of 151,936 tokens: a broadcast shift of the int32 words took 24 ms a row, `torch.where`
# on a bool mask 6.4 ms; the gather and the add take ~0.4 ms + ~0.3 ms.
_BYTE_BIAS = torch.where(((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool(), 0.0, -torch.inf)


def ll_tokenizer(tokenizer: Any, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer` with `vocab_size` logits columns, built once per tokenizer."""
    key = (id(tokenizer), vocab_size)
    with _lock:
        cached = _tokenizers.get(key)
        if cached is None or cached[0] is not tokenizer:
            cached = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size))
            _tokenizers[key] = cached
        return cached[1]


class GrammarMatcher:
    """One request's grammar: the tokens allowed next, and its state after each accepted token.

    The end of sequence is allowed only where the grammar is complete; once the grammar can take
    nothing more (`is_finished`), the answer ends."""

    def __init__(self, spec: dict[str, Any], tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer = ll_tokenizer(tokenizer, vocab_size)
        self.vocab_size = vocab_size
        grammar = grammar_spec.to_llguidance(grammar_spec.canonical(grammar_spec.without_prefix(spec)))
        self.matcher = llguidance.LLMatcher(self.tokenizer, grammar)
        self._raise_on_error()
        for token_id in spec.get("prefix_ids", ()):  # tokens written under it before this request
            self.advance(token_id)

    def fill_mask(self, bitmask: torch.Tensor) -> None:
        """Writes the allowed tokens of the next step into `bitmask` ((W,) int32, bit i%32 of word
        i//32 set = token i allowed; W = ceil(V / 32))."""
        self.matcher.unsafe_compute_mask_ptr(bitmask.data_ptr(), bitmask.numel() * bitmask.element_size())
        self._raise_on_error()

    def advance(self, token_id: int) -> None:
        """Takes the accepted token; a token the grammar does not allow is a ValueError."""
        if not self.matcher.consume_token(token_id):
            raise ValueError(f"token {token_id} does not fit the grammar: {self.matcher.get_error()}")

    @property
    def is_finished(self) -> bool:
        """The grammar is complete and can take nothing more (only the end of sequence)."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    @property
    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    def _raise_on_error(self) -> None:
        if self.matcher.is_error():
            raise ValueError(f"grammar error: {self.matcher.get_error()}")


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def apply_masks(logits: torch.Tensor, matchers: Sequence[GrammarMatcher | None]) -> torch.Tensor:
    """`logits` (S, V) float32 -> the logits with each grammar's disallowed tokens at -inf (S, V).
    The input is not modified; with no grammar it comes back as it is."""
    indices = [i for i, m in enumerate(matchers) if m is not None]
    if not indices:
        return logits
    vocab_size = logits.shape[-1]
    bitmask = torch.zeros(len(indices), bitmask_words(vocab_size), dtype=torch.int32)  # (G, W), host
    for row, i in enumerate(indices):
        matchers[i].fill_mask(bitmask[row])
    # Little-endian words: token k is bit k % 8 of byte k // 8 of its row.
    words = bitmask.view(torch.uint8).flatten().int().to(logits.device)  # (G * 4W,)
    bias = torch.index_select(_BYTE_BIAS.to(logits.device), 0, words).view(len(indices), -1)[:, :vocab_size]
    if len(indices) == len(matchers):  # every row has a grammar: no copy of the rows
        return logits + bias
    masked = logits.clone()
    masked[torch.tensor(indices, device=logits.device)] += bias
    return masked


def removed_mass(raw_logprobs: torch.Tensor, masked_logprobs: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """(G,) the mass of each raw distribution (G, V) its grammar removed, given the masked
    distribution's log-softmax (G, V) and one allowed token per row (G,) (its argmax): for an
    allowed token t, p_masked(t) = p_raw(t) / kept, so kept = exp(raw(t) - masked(t)). Two reads
    instead of summing the allowed probabilities (torch's exp of -inf runs ~10x slower than of a
    number on this CPU)."""
    allowed = allowed[:, None]  # (G, 1)
    kept = torch.exp(raw_logprobs.gather(-1, allowed) - masked_logprobs.gather(-1, allowed)).squeeze(-1)
    return (1 - kept).clamp(0.0, 1.0)
