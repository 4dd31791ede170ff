"""The sampler stage by stage: the distribution after each logits processor, in the order
the engine runs them (repetition penalty -> temperature -> top-k -> top-p -> min-p).

Owns: the read-out of each stage (how many tokens are left, which were removed and how much
probability they held, the entropy, the top tokens, where the sampled token is). The stages
are `inference.sampling.logits.build_processors` itself, run one at a time: nothing here
reimplements a processor. Must not know: models, requests, Django.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from inference.sampling.logits import MinP, RepetitionPenalty, Temperature, TopK, TopP, build_processors
from inference.sampling.sampler import entropy, token_rank
from inference.sampling_params import SamplingParams

_STAGE_NAMES = {
    RepetitionPenalty: ("repetition_penalty", "penalty"),
    Temperature: ("temperature", "temperature"),
    TopK: ("top_k", "k"),
    TopP: ("top_p", "p"),
    MinP: ("min_p", "p"),
}


def stage_of(processor: Any) -> tuple[str, float]:
    """(stage name, its setting) of one processor."""
    name, field = _STAGE_NAMES[type(processor)]
    return name, getattr(processor, field)


def waterfall(
    logits: torch.Tensor,
    context_ids: torch.Tensor,
    params: SamplingParams,
    sampled_token_id: int | None = None,
    top_n: int = 10,
) -> dict[str, Any]:
    """Every stage's distribution for one step: `logits` (V,) raw, `context_ids` (T,) the
    tokens before the step (the repetition penalty reads them)."""
    logits = logits.float()
    stages = [_read_out("raw", None, logits, None, sampled_token_id, top_n)]
    previous = logits
    for processor in build_processors(params):
        name, setting = stage_of(processor)
        current = processor(previous[None], context_ids[None])[0]
        stages.append(_read_out(name, setting, current, previous, sampled_token_id, top_n))
        if name == "repetition_penalty":
            stages[-1]["num_penalized"] = int(torch.unique(context_ids).numel())
        previous = current
    return {
        "stages": stages,
        "is_greedy": params.is_greedy,
        "sampled_token_id": sampled_token_id,
        "final_token_id": int(previous.argmax()) if params.is_greedy else None,
    }


def _read_out(
    name: str,
    setting: float | None,
    logits: torch.Tensor,
    previous: torch.Tensor | None,
    sampled_token_id: int | None,
    top_n: int,
) -> dict[str, Any]:
    logprobs = torch.log_softmax(logits, dim=-1)
    is_kept = torch.isfinite(logits)
    stage: dict[str, Any] = {
        "name": name,
        "setting": setting,
        "num_kept": int(is_kept.sum()),
        "entropy": float(entropy(logprobs[None])[0]),
        "top": _top(logprobs, top_n),
        "num_removed": 0,
        "removed_mass": 0.0,  # the probability the removed tokens held just before this stage
        "removed_top": [],
    }
    if previous is not None:
        removed = torch.isfinite(previous) & ~is_kept
        previous_probs = torch.softmax(previous, dim=-1)
        stage["num_removed"] = int(removed.sum())
        stage["removed_mass"] = float(previous_probs[removed].double().sum())
        masked = torch.where(removed, previous_probs, torch.zeros_like(previous_probs))
        stage["removed_top"] = _top(torch.log(masked), min(top_n, stage["num_removed"]))
    if sampled_token_id is not None:
        lp = float(logprobs[sampled_token_id])
        stage["sampled"] = {
            "prob": math.exp(lp),
            "rank": token_rank(logprobs, sampled_token_id) if lp > -math.inf else None,
            "is_kept": bool(is_kept[sampled_token_id]),
        }
    return stage


def _top(logprobs: torch.Tensor, n: int) -> list[dict[str, float | int]]:
    """The `n` most likely tokens (id, prob, logprob), most likely first; -inf left out."""
    if n <= 0:
        return []
    values, ids = torch.topk(logprobs, min(n, logprobs.shape[-1]))
    return [
        {"token_id": int(i), "prob": math.exp(float(v)), "logprob": float(v)}
        for v, i in zip(values, ids)
        if v > -math.inf
    ]
