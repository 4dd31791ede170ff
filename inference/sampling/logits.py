"""Logits processors: pure functions from next-token logits to processed logits.

Owns: repetition penalty, temperature, top-k, top-p and min-p, with the semantics of the
matching transformers `LogitsProcessor`/`LogitsWarper` classes, and the one order they run in.
Must not know: models, caches, sampling itself (see `inference.sampling.sampler`), Django.

Order (`build_processors`): repetition penalty -> temperature -> top-k -> top-p -> min-p.
This is transformers' order, so a setting means here what it means there. The penalty comes
first because it edits raw logits by sign (divide positive, multiply negative), which only
makes sense before any rescaling. Temperature comes before the filters because top-p and
min-p read probabilities, and a user asking for "temperature 0.7, top-p 0.9" means the
nucleus of the tempered distribution. Top-k before top-p is transformers' choice; the two
commute except on ties at the top-k boundary.

Every processor returns a new tensor and never modifies its input; a filtered token gets
`-inf`. Shapes: `logits` (B, V) float, `context_ids` (B, T) the tokens the repetition penalty
counts (`penalized_ids`: prompt + generated so far, or the generated ones only).

No valid `SamplingParams` can empty a row or fill it with NaN (tests/inference/sampling/test_sampling_fuzz.py):
the filters always keep the most likely token, and the two processors that scale logits cap
what overflows at the dtype's largest value (`_capped`) instead of letting it become `inf`,
whose softmax is NaN; `SamplingParams` keeps the scale factors in a range where that only
happens to absurd logits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from inference.sampling_params import SamplingParams

FILTERED = -math.inf
IdsT = TypeVar("IdsT", list[int], torch.Tensor)


class LogitsProcessor(Protocol):
    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor: ...


def _capped(logits: torch.Tensor) -> torch.Tensor:
    """`+inf` from an overflow becomes the dtype's largest value (the token stays the most likely);
    `-inf` (a filtered or masked token) stays."""
    return logits.clamp(max=torch.finfo(logits.dtype).max)


def _check_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a finite number > 0")


def _check_fraction(name: str, value: float, low_open: bool) -> None:
    is_number = not isinstance(value, bool) and isinstance(value, (int, float))
    too_low = is_number and (value <= 0 if low_open else value < 0)
    if not is_number or not math.isfinite(value) or too_low or value > 1:
        interval = "(0, 1]" if low_open else "[0, 1]"
        raise ValueError(f"{name}={value!r} must be in {interval}")


@dataclass(frozen=True)
class RepetitionPenalty:
    """CTRL's penalty on every token of `context_ids` (`penalized_ids`: the prompt's and the
    generated ones, or the generated ones only), once per token: a positive logit is divided by
    `penalty`, a negative one multiplied. > 1 discourages repeats."""

    penalty: float

    def __post_init__(self) -> None:
        _check_positive("repetition_penalty", self.penalty)

    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        if context_ids.numel() == 0:
            return logits.clone()
        # Ids past the logits (an embedding table larger than the LM head) cannot be generated:
        # route them to one padding column, dropped afterwards, as transformers does.
        vocab_size = logits.shape[-1]
        context_ids = context_ids.clamp(max=vocab_size)
        padded = torch.nn.functional.pad(logits, (0, 1))
        seen = torch.gather(padded, 1, context_ids)
        penalized = _capped(torch.where(seen < 0, seen * self.penalty, seen / self.penalty))
        return padded.scatter(1, context_ids, penalized)[..., :vocab_size]


@dataclass(frozen=True)
class Temperature:
    """Divides logits by `temperature`: < 1 sharpens the distribution, > 1 flattens it."""

    temperature: float

    def __post_init__(self) -> None:
        _check_positive("temperature", self.temperature)

    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        return _capped(logits / self.temperature)


@dataclass(frozen=True)
class TopK:
    """Keeps the `k` highest logits; every token tied with the k-th is kept too."""

    k: int

    def __post_init__(self) -> None:
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"top_k={self.k!r} must be an integer >= 1")

    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        k = min(self.k, logits.shape[-1])
        kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]
        return logits.masked_fill(logits < kth_largest, FILTERED)


@dataclass(frozen=True)
class TopP:
    """Nucleus filter: keeps the smallest set of most likely tokens whose probabilities sum to
    at least `p`, and always the most likely one.

    Same computation as transformers' TopPLogitsWarper (ascending sort, drop the tail whose
    cumulative probability is <= 1 - p), so ties at the boundary resolve the same way.
    """

    p: float

    def __post_init__(self) -> None:
        _check_fraction("top_p", self.p, low_open=True)

    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        num_candidates = int(torch.isfinite(logits).sum(dim=-1).max())
        if num_candidates == logits.shape[-1]:
            sorted_logits, sorted_ids = torch.sort(logits, descending=False)
        else:
            # Filtered tokens hold no probability: after top-k, ordering the survivors is
            # enough (a 50-token topk instead of a sort of the whole vocabulary).
            top_logits, top_ids = torch.topk(logits, num_candidates, dim=-1)
            sorted_logits, sorted_ids = top_logits.flip(-1), top_ids.flip(-1)
        cumulative_probs = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        sorted_is_removed = cumulative_probs <= (1 - self.p)
        sorted_is_removed[..., -1:] = False
        is_removed = torch.ones_like(logits, dtype=torch.bool).scatter(1, sorted_ids, sorted_is_removed)
        return logits.masked_fill(is_removed, FILTERED)


@dataclass(frozen=True)
class MinP:
    """Keeps tokens whose probability is at least `p` times the most likely token's."""

    p: float

    def __post_init__(self) -> None:
        _check_fraction("min_p", self.p, low_open=False)

    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits, dim=-1)
        threshold = self.p * probs.amax(dim=-1, keepdim=True)
        # p <= 1, so the most likely token always survives.
        return logits.masked_fill(probs < threshold, FILTERED)


def penalized_ids(token_ids: IdsT, num_prompt_tokens: int, params: SamplingParams) -> IdsT:
    """The tokens the repetition penalty counts: `token_ids` (prompt + generated so far, a list
    or a (T,) / (B, T) tensor), or with `penalize_prompt` off only the generated ones."""
    if params.penalize_prompt:
        return token_ids
    return token_ids[..., num_prompt_tokens:] if isinstance(token_ids, torch.Tensor) else token_ids[num_prompt_tokens:]


def build_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """The processors `params` turns on, in the module's fixed order.

    Under greedy decoding only the repetition penalty is kept: temperature and the filters
    never change which token has the highest logit.
    """
    processors: list[LogitsProcessor] = []
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(params.repetition_penalty))
    if params.is_greedy:
        return processors
    if params.temperature != 1.0:
        processors.append(Temperature(params.temperature))
    if params.top_k > 0:
        processors.append(TopK(params.top_k))
    if params.top_p < 1.0:
        processors.append(TopP(params.top_p))
    if params.min_p > 0.0:
        processors.append(MinP(params.min_p))
    return processors


def apply_processors(
    processors: Sequence[LogitsProcessor], logits: torch.Tensor, context_ids: torch.Tensor
) -> torch.Tensor:
    """Runs `processors` in order; returns `logits` itself when there are none (callers must
    not modify the result in place)."""
    for processor in processors:
        logits = processor(logits, context_ids)
    return logits
