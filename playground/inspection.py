"""The inspection request: what the explorer may ask a worker about a finished generation.

Owns: the request's fields and their validation (both processes run it: the web side to
refuse bad input at once, the worker again on what it received), the views, the sampling
settings an inspection may change and the wait for the answer. Must not know: torch,
sockets, the ORM.

The views (see docs/inside.md): "waterfall" (one step's distribution after each sampler
stage), "whatif" (every step replayed under other settings until the first token that
differs), "lens" (one token's embedding, the top predictions after every layer, the
attention of each head of one layer), "kv" (the cache's size from the model's shapes),
"prompt_logprobs" (each prompt token's logprob after the ones before it, with `top_n`
alternatives: the OpenAI API's `echo` with `logprobs`), "moe" (for every step of the path,
which experts each mixture-of-experts layer chose and with what weight; `not_moe` for a dense
model), "roofline" (the request's timeline, and its prefill and decode on the roofline of the
worker's measured device limits), "ab" (this generation as side A against
`other_generation_id` as side B: both chosen tokens per step, the flips and the KL divergence
between the two sides' distributions; each side keeps its own settings), "precision" (every
step's next-token distribution under the served weights and under the same model in another
`precision`, with the KL divergence between them).
"""

from __future__ import annotations

from typing import Any

from inference.config import VALID_DTYPES
from inference.sampling_params import SamplingParams
from playground.protocol import CommandError, get_field

VIEWS = ("waterfall", "whatif", "lens", "kv", "prompt_logprobs", "moe", "roofline", "ab", "precision")
PRECISIONS = tuple(p for p in VALID_DTYPES if p != "auto")
SETTINGS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "penalize_prompt", "seed", "greedy")
MAX_TOP_N = 50
WAIT_S = 120.0  # the web side's wait for the worker's answer (the first one may load the model)


def parse(content: dict[str, Any], generation_params: dict[str, Any]) -> dict[str, Any]:
    """The checked request: {view, step, layer, top_n, other_generation_id, precision, params}; `params` is
    the generation's own settings with the request's changes (a CommandError names the bad field)."""
    if not isinstance(content, dict):
        raise CommandError("invalid_field", "the request body must be a JSON object")
    view = get_field(content, "view", str, required=True)
    if view not in VIEWS:
        raise CommandError("invalid_field", f"view={view!r} must be one of {', '.join(VIEWS)}")
    step = get_field(content, "step", int, default=0)
    layer = get_field(content, "layer", int)
    top_n = get_field(content, "top_n", int, default=10)
    if step < 0:
        raise CommandError("invalid_field", f"step={step} must be >= 0")
    if not (0 if view == "prompt_logprobs" else 1) <= top_n <= MAX_TOP_N:
        raise CommandError("invalid_field", f"top_n={top_n} must be in 1..{MAX_TOP_N}")
    other_generation_id = get_field(content, "other_generation_id", int, required=view == "ab")
    precision = get_field(content, "precision", str, required=view == "precision")
    if precision is not None and precision not in PRECISIONS:
        raise CommandError("invalid_field", f"precision={precision!r} must be one of {', '.join(PRECISIONS)}")
    changes = get_field(content, "params", dict, default={})
    if view == "ab" and changes:
        raise CommandError("invalid_field", "view='ab' compares the two generations' own settings: send no params")
    return {
        "view": view,
        "step": step,
        "layer": layer,
        "top_n": top_n,
        "other_generation_id": other_generation_id,
        "precision": precision,
        "params": settings_of(generation_params, changes),
    }


def settings_of(generation_params: dict[str, Any], changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """A generation's settings with `changes`, as one sampled path (no beams), checked."""
    unknown = sorted(set(changes or {}) - set(SETTINGS))
    if unknown:
        raise CommandError("invalid_field", f"params may change only {', '.join(SETTINGS)}; not {', '.join(unknown)}")
    merged = {**generation_params, **(changes or {}), "num_beams": 1, "num_return_sequences": 1}
    try:
        return SamplingParams.from_dict(merged).to_dict()
    except (TypeError, ValueError) as exc:
        raise CommandError("invalid_params", str(exc)) from exc
