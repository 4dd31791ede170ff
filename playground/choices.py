"""Several choices of one prompt (`n` of the OpenAI API): what makes choice `i` its own sequence.

Owns: the seed rule both sides use, so the rows the web side files and the sequences the
worker's engine runs agree: choice `i` samples with the request's seed + i (wrapping within
the seed's range), so a seeded request is reproducible and its choices still differ; without a
seed each choice draws its own. Must not know: HTTP, the ORM, the engine's insides.
"""

from __future__ import annotations

from dataclasses import replace

from inference.sampling_params import MAX_SEED, SamplingParams


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """The params choice `index` samples with (choice 0's are `params` themselves)."""
    if index < 0:
        raise ValueError(f"index={index} must be >= 0")
    if index == 0 or params.seed is None:
        return params
    return replace(params, seed=(params.seed + index) % (MAX_SEED + 1))
