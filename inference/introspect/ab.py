"""Side-by-side A/B of two generations of one prompt: per step both chosen tokens, whether
they differ (a "flip") and the exact KL divergence KL(A||B) between the two distributions the
tokens were drawn from, over the whole vocabulary.

Owns: a side's sampling distribution for one step (the processed logits of `build_processors`,
the engine's `Sampler`'s processors, run here in float64; greedy's is all on its top token), the
KL between two of them, and the step-by-step alignment of two paths. Must not know: models (it reads
`Recomputed` logits), requests, Django.

Up to and including the first flip both sides read the same context (the prompt and the
tokens they share), so the KL compares two settings on the same scores. After it the contexts
differ: each side's distribution is recomputed by teacher forcing its own path, and the KL
compares two settings *and* two texts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from inference.introspect.recompute import Recomputed
from inference.sampling.logits import apply_processors, build_processors, penalized_ids
from inference.sampling_params import SamplingParams


@dataclass(frozen=True)
class Side:
    """One side of the comparison: its path's recomputed logits and its sampling settings.
    Other weights (another precision) would be another `recomputed`, from those weights."""

    recomputed: Recomputed
    params: SamplingParams

    @property
    def path(self) -> list[int]:
        return self.recomputed.token_ids[self.recomputed.num_prompt_tokens :].tolist()

    @property
    def prompt(self) -> list[int]:
        return self.recomputed.token_ids[: self.recomputed.num_prompt_tokens].tolist()


def sampling_logprobs(logits: torch.Tensor, recomputed: Recomputed, step: int, params: SamplingParams) -> torch.Tensor:
    """The log-probabilities (V,) step `step` of `recomputed` is drawn with under `params`, in
    float64: `logits` (V,) raw (this side's, or the other side's while the paths agree); the
    repetition penalty reads the tokens before the step that `penalized_ids` keeps.
    float64 because the KL sums 49k terms: the sampler's float32 tempering and normalizer are each
    ~1e-6 off in every logprob, which is 1e-5 of a KL of 0.1 (the float32 logits convert exactly)."""
    context_ids = penalized_ids(recomputed.context(step), recomputed.num_prompt_tokens, params)
    processed = apply_processors(build_processors(params), logits.double()[None], context_ids[None])[0]
    if params.is_greedy:
        # Greedy takes the top token with probability 1 (the sampler's argmax of the logits).
        point = torch.full_like(processed, -math.inf)
        point[processed.argmax()] = 0.0
        return point
    return torch.log_softmax(processed, dim=-1)


def kl_divergence(logprobs_a: torch.Tensor, logprobs_b: torch.Tensor) -> float:
    """KL(A||B) = sum over tokens of p_A * (log p_A - log p_B), in nats, over (V,) logprobs.

    Tokens A never draws add 0; infinite when A can draw a token B filtered out (-inf)."""
    a, b = logprobs_a.double(), logprobs_b.double()
    drawn = torch.isfinite(a)
    if bool(torch.isneginf(b[drawn]).any()):
        return math.inf
    kl = float((a[drawn].exp() * (a[drawn] - b[drawn])).sum())
    return max(kl, 0.0)  # KL >= 0: a negative value is float64 rounding of identical distributions


def compare(a: Side, b: Side, same_weights: bool = True) -> dict[str, Any]:
    """Aligns the two paths step by step over the steps both have.

    `same_weights`: both sides read one model, so in the shared context B's logits are A's
    (one pass, no rounding difference between two passes); other weights would pass False."""
    if a.prompt != b.prompt:
        raise ValueError("the two sides must continue the same prompt")
    path_a, path_b = a.path, b.path
    num_steps = min(len(path_a), len(path_b))
    first_flip = next((k for k in range(num_steps) if path_a[k] != path_b[k]), None)
    steps = []
    for k in range(num_steps):
        same_context = first_flip is None or k <= first_flip
        logits_a = a.recomputed.logits(k)
        logits_b = logits_a if same_context and same_weights else b.recomputed.logits(k)
        logprobs_a = sampling_logprobs(logits_a, a.recomputed, k, a.params)
        logprobs_b = sampling_logprobs(logits_b, b.recomputed, k, b.params)
        steps.append(
            {
                "index": k,
                "a_token_id": path_a[k],
                "b_token_id": path_b[k],
                "flipped": path_a[k] != path_b[k],
                "same_context": same_context,
                "kl": kl_divergence(logprobs_a, logprobs_b),  # inf: A can draw a token B filtered out
            }
        )
    return {
        "params": {"a": a.params.to_dict(), "b": b.params.to_dict()},
        "num_steps": num_steps,
        "num_steps_a": len(path_a),
        "num_steps_b": len(path_b),
        "first_flip": first_flip,
        "steps": steps,
    }
