"""One generation's next-token distributions under two weight precisions, side by side.

Owns: the same path teacher-forced through the served path and through the same model in
another precision (float32, bfloat16, int8, int4), and per step: each side's top tokens, the KL
divergence between the two raw distributions (the model's own softmax: the precision changes
the model, not the sampler) and whether the most likely token differs. Must not know: where
the second model comes from, requests, Django.
"""

from __future__ import annotations

from typing import Any

import torch

from inference.introspect.ab import kl_divergence
from inference.introspect.recompute import Recomputed, recompute
from inference.sampling.sampler import top_alternatives


def compare_precisions(served: Recomputed, other_model: Any, top_n: int) -> dict[str, Any]:
    """Every step of `served`'s path (teacher-forced through the served path: the streamed
    numbers) against the same path through `other_model`, a transformers model in another
    precision that no engine serves."""
    prompt_ids = served.token_ids[: served.num_prompt_tokens].tolist()
    path = served.token_ids[served.num_prompt_tokens :].tolist()
    other = recompute(other_model, prompt_ids, path)
    steps = []
    for k in range(served.num_steps):
        served_logprobs = torch.log_softmax(served.logits(k).double(), dim=-1)  # (V,)
        other_logprobs = torch.log_softmax(other.logits(k).double(), dim=-1)
        steps.append(
            {
                "index": k,
                "token_id": path[k],
                "kl": kl_divergence(served_logprobs, other_logprobs),
                "served": _side(served_logprobs, path[k], top_n),
                "other": _side(other_logprobs, path[k], top_n),
            }
        )
    num_flips = sum(s["served"]["top"][0]["token_id"] != s["other"]["top"][0]["token_id"] for s in steps)
    return {
        "steps": steps,
        "mean_kl": sum(s["kl"] for s in steps) / len(steps),
        "max_kl": max(s["kl"] for s in steps),
        "num_top_flips": num_flips,
    }


def _side(logprobs: torch.Tensor, token_id: int, top_n: int) -> dict[str, Any]:
    ids, values = top_alternatives(logprobs, top_n)
    return {
        "top": [{"token_id": i, "logprob": lp} for i, lp in zip(ids, values)],
        "token_logprob": float(logprobs[token_id]),  # the generated token's, under this precision
    }
