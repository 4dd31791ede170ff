"""Picking the next token from logits: seeded random sampling or greedy argmax.

Owns: the per-request random generator (and so reproducibility: the same seed gives the same
tokens run after run on the same device), the processed and raw log-probabilities every step
reports, and small read-outs of a distribution (top alternatives, entropy, rank).
Must not know: models, caches, tokenizers, events.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from inference.kernels import cpu as cpu_kernels
from inference.sampling.logits import apply_processors, build_processors
from inference.sampling_params import SamplingParams


@dataclass(frozen=True)
class SampleOutput:
    token_ids: torch.Tensor  # (B,) int64
    logprobs: torch.Tensor  # (B, V) log-softmax of the processed logits: what was sampled from
    raw_logprobs: torch.Tensor  # (B, V) log-softmax of the model's raw logits


class Sampler:
    """Turns one step's logits into token ids under one request's `SamplingParams`.

    Owns a `torch.Generator` on `device`, seeded with `params.seed` or, when that is None, with
    a fresh random seed exposed as `.seed` so the run can be repeated.
    """

    def __init__(self, params: SamplingParams, device: torch.device | str):
        self.params = params
        self.processors = build_processors(params)
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(self.seed)

    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> SampleOutput:
        """`logits` (B, V) in any float dtype; `context_ids` (B, T) = prompt + generated so far."""
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        processed = apply_processors(self.processors, logits, context_ids)
        logprobs = torch.log_softmax(processed, dim=-1) if self.processors else raw_logprobs
        if self.params.is_greedy:
            # On the logits, not the logprobs: subtracting the log-normalizer can round two
            # distinct logits to one value and so change which index wins.
            token_ids = processed.argmax(dim=-1)
        else:
            token_ids = _draw(logprobs.exp(), self.generator)
        _check_drawn(token_ids, logprobs)
        return SampleOutput(token_ids=token_ids, logprobs=logprobs, raw_logprobs=raw_logprobs)


def _check_drawn(token_ids: torch.Tensor, logprobs: torch.Tensor) -> None:
    """A clear error for a distribution with nothing to draw (NaN logits from the model, or every
    token filtered), instead of an index past the vocabulary further on. O(B): it reads the
    chosen tokens only (argmax picks a NaN; inverse-CDF sampling over NaN gives index V)."""
    vocab_size = logprobs.shape[-1]
    chosen = logprobs.gather(-1, token_ids.clamp(max=vocab_size - 1)[:, None])
    if bool((token_ids >= vocab_size).any()) or not bool(torch.isfinite(chosen).all()):
        raise ValueError("the sampling distribution is empty or not a number (NaN logits, or every token filtered)")


def _draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs` (B, V) by inverse-CDF sampling: one uniform number per row,
    about 10x cheaper than `torch.multinomial` on a 49k vocabulary on CPU."""
    # float64 so tokens with tiny probabilities keep their share of the cumulative sum.
    cdf = probs.double().cumsum(dim=-1)
    uniform = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    # 1 - U lies in (0, 1]: the first index whose cumulative mass reaches the target then
    # always has a positive probability, and the target never passes the total.
    target = (1 - uniform) * cdf[:, -1:]
    return torch.searchsorted(cdf, target).squeeze(-1)


# Every step reports these read-outs of a 49k-entry distribution; torch spends 25-80 us on each
# (a sort, several full passes), the fused CPU kernels one pass each.
def _kernels_for(logprobs: torch.Tensor, ndim: int) -> cpu_kernels.CpuKernels | None:
    """The kernels when they can read `logprobs` (an `ndim`-dim contiguous float32 CPU tensor)."""
    if logprobs.device.type != "cpu" or logprobs.dtype != torch.float32 or not logprobs.is_contiguous():
        return None
    return cpu_kernels.load() if logprobs.dim() == ndim else None


def top_alternatives(logprobs: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """The `k` most likely token ids of one distribution (V,) and their logprobs, most likely
    first (ties in id order); filtered (-inf) tokens are left out, so fewer than `k` may come back."""
    k = min(k, logprobs.shape[-1])
    if k <= 0:
        return [], []
    kernels = _kernels_for(logprobs, 1)
    values, ids = kernels.top_k(logprobs, k) if kernels else torch.topk(logprobs, k)
    is_kept = values > -torch.inf
    return ids[is_kept].tolist(), values[is_kept].tolist()


def entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dim ((B, V) -> (B,)); -inf entries contribute 0."""
    kernels = _kernels_for(logprobs, 2)
    if kernels is not None:
        return torch.tensor([kernels.entropy(row) for row in logprobs])
    terms = logprobs.exp() * logprobs
    return -torch.where(torch.isneginf(logprobs), 0.0, terms).sum(dim=-1)


def token_rank(logprobs: torch.Tensor, token_id: int) -> int:
    """1-based rank of `token_id` in one distribution (V,); tied tokens share the better rank."""
    kernels = _kernels_for(logprobs, 1)
    if kernels is not None:
        return kernels.count_greater(logprobs, float(logprobs[token_id])) + 1
    return int((logprobs > logprobs[token_id]).sum().item()) + 1
