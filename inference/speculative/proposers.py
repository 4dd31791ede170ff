"""What proposes the tokens a verification pass checks: cheap guesses of the next few tokens.

Owns: n-gram lookup (the last few tokens of the text so far, found earlier in a source, and what
followed them there), over the prompt and the answer (`prompt_lookup`, llama.cpp's and vLLM's
"prompt lookup decoding") or over a prediction the request gave (OpenAI's Predicted Outputs);
a draft model's proposals are `inference.speculative.draft`'s. A proposer only guesses: the
verification keeps what the model itself would have chosen, so a bad guess costs time, never a
different answer.
Must not know: models, sampling, the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_NGRAM = 4  # the longest suffix looked up: a longer match is likelier to go on the same way
MIN_NGRAM = 1


@dataclass(frozen=True)
class Proposal:
    """Proposed token ids, and the proposer's probability of each (1.0: a lookup's sure guess)."""

    token_ids: list[int]
    draft_probs: list[float]
    source: str  # "prompt_lookup", "prediction" or the draft model's name
    kind: str = "draft"  # what its acceptance is judged by: "aligned", "ngram<n>" (n tokens matched), "draft"


def lookup(source: np.ndarray, suffix: np.ndarray, max_tokens: int) -> tuple[list[int], int]:
    """The `max_tokens` tokens that followed the latest occurrence of `suffix`'s longest tail
    (`MAX_NGRAM` down to `MIN_NGRAM` tokens) in `source` that something follows, and that tail's
    length; ([], 0) when none does. (When `suffix` is `source`'s own end, that end is followed by
    nothing: no match.)"""
    if max_tokens <= 0:
        return [], 0
    head = source[:-1]  # a match must be followed by a token
    for n in range(min(MAX_NGRAM, len(suffix)), MIN_NGRAM - 1, -1):
        if len(head) < n:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(head, n)  # (len(head) - n + 1, n)
        starts = np.flatnonzero((windows == suffix[-n:]).all(axis=1))
        if len(starts):
            end = int(starts[-1]) + n
            return source[end : end + max_tokens].tolist(), n
    return [], 0


def _lookup_proposal(found: list[int], n: int, source: str) -> Proposal | None:
    return Proposal(found, [1.0] * len(found), source, f"ngram{n}") if found else None


@dataclass
class PromptLookup:
    """Proposes from the request's own tokens: an answer that quotes its prompt (code to edit, a
    document to summarize) or repeats itself finds its next tokens there."""

    name: str = "prompt_lookup"
    kind: str = "ngram"  # each proposal says its n-gram's length
    draft_ms: float = 0.0

    def propose(self, token_ids: list[int], num_generated: int, max_tokens: int) -> Proposal | None:
        tokens = np.asarray(token_ids, dtype=np.int64)
        return _lookup_proposal(*lookup(tokens, tokens[-MAX_NGRAM:], max_tokens), self.name)


@dataclass
class PredictionLookup:
    """Proposes from a prediction of the answer (OpenAI's `prediction`): while the answer follows
    it, its next tokens; after a difference, the continuation of the answer's last n-gram in it."""

    prediction_ids: list[int]
    name: str = "prediction"
    kind: str = "aligned"
    draft_ms: float = 0.0
    _source: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._source = np.asarray(self.prediction_ids, dtype=np.int64)

    def propose(self, token_ids: list[int], num_generated: int, max_tokens: int) -> Proposal | None:
        answer = token_ids[len(token_ids) - num_generated :]
        if answer == self.prediction_ids[: len(answer)]:  # still word for word (the start included)
            found = self.prediction_ids[len(answer) : len(answer) + max_tokens]
            return Proposal(found, [1.0] * len(found), self.name, "aligned") if found else None
        suffix = np.asarray(answer[-MAX_NGRAM:], dtype=np.int64)
        return _lookup_proposal(*lookup(self._source, suffix, max_tokens), self.name)
