"""What-if resampling: the same recomputed logits, other sampling settings.

Owns: replaying a finished generation's steps through a fresh `Sampler` (the engine's own:
same processors, same one-uniform-per-step draw, same seeded generator), reporting for each
step the new distribution, the token it draws and the probability it gives the token that
was actually generated, up to and including the first step whose token differs; and for
every step (no draw needed) the probability the new settings give the generated token. From there
on the context differs from the generation's, so its logits are unknown without running the
model: that step's token is exactly what a real run with these settings and this seed would
have produced (the earlier steps saw the same tokens, drew the same uniforms), and a real
branch continues from it.
Must not know: models, requests, Django.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch

from inference.introspect.recompute import Recomputed
from inference.sampling.logits import apply_processors, penalized_ids
from inference.sampling.sampler import Sampler, token_rank, top_alternatives
from inference.sampling_params import SamplingParams


def what_if(recomputed: Recomputed, params: SamplingParams, top_n: int = 5) -> dict[str, Any]:
    """Replays every step under `params` (its `seed`, or a fresh one reported back) until the
    first token that differs from the generation's."""
    sampler = Sampler(replace(params, num_beams=1), recomputed.token_ids.device)
    generated = recomputed.token_ids[recomputed.num_prompt_tokens :].tolist()
    steps: list[dict[str, Any]] = []
    for k, original in enumerate(generated):
        out = sampler(recomputed.logits(k)[None], _penalized(recomputed, k, params)[None])
        logprobs = out.logprobs[0]
        token = int(out.token_ids[0])
        original_lp = float(logprobs[original])
        ids, lps = top_alternatives(logprobs, top_n)
        steps.append(
            {
                "index": k,
                "original_token_id": original,
                "original_prob": math.exp(original_lp),
                "original_rank": token_rank(logprobs, original) if original_lp > -math.inf else None,
                "token_id": token,
                "prob": math.exp(float(logprobs[token])),
                "raw_logprob": float(out.raw_logprobs[0, token]),  # under the model's own distribution
                "num_kept": int(torch.isfinite(logprobs).sum()),
                "top": [{"token_id": i, "prob": math.exp(lp)} for i, lp in zip(ids, lps)],
            }
        )
        if token != original:
            break
    diverged_at = steps[-1]["index"] if steps and steps[-1]["token_id"] != steps[-1]["original_token_id"] else None
    original_probs = [step["original_prob"] for step in steps] + [
        _original_prob(recomputed, sampler, k, generated[k]) for k in range(len(steps), len(generated))
    ]
    first_filtered = next((k for k, p in enumerate(original_probs) if p == 0.0), None)
    return {
        "seed": sampler.seed,
        "params": sampler.params.to_dict(),
        "num_steps": len(generated),
        "steps": steps,
        "diverged_at": diverged_at,
        "first_filtered_at": first_filtered,
        # Seed-free: how likely these settings make each token the generation actually chose.
        "original_probs": original_probs,
    }


def _original_prob(recomputed: Recomputed, sampler: Sampler, step: int, token_id: int) -> float:
    """The probability step `step`'s distribution under the sampler's processors gives
    `token_id` (no draw: the sampler's generator is left as it is)."""
    logits = recomputed.logits(step)[None]
    processed = apply_processors(sampler.processors, logits, _penalized(recomputed, step, sampler.params)[None])
    return math.exp(float(torch.log_softmax(processed, dim=-1)[0, token_id]))


def _penalized(recomputed: Recomputed, step: int, params: SamplingParams) -> torch.Tensor:
    """(T,) the tokens before step `step` that the repetition penalty counts."""
    return penalized_ids(recomputed.context(step), recomputed.num_prompt_tokens, params)
