"""The differential fuzz's random mix: what arrives at the fuzzed engine, and when.

Owns: `Case` (one request or inspection: its kind, prompt, settings, arrival step, cancel point),
drawing a seeded mix of them from prompt material (shared bases cut at random places, so prompts
share prefixes of every length, at block boundaries and inside blocks, then diverge), and a
case's recipe (the text a mismatch report prints to replay it). The same seed and material give
the same cases. Must not know: engines, models, how a case is run or compared (`fuzz.py`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any

from inference.sampling_params import SamplingParams

# Requests: the served path's ways to generate. Inspections: the explorer's and the lesson's
# passes through the same engine (`introspect/passes.py`). "switch": another model (or another
# precision of this one) loaded in the same process, run and dropped, as the precision view
# and a model registered from a .gguf make the worker do.
REQUEST_KINDS = ("generate", "no_kv", "choices", "beam", "handoff")
INSPECTION_KINDS = ("teacher_force", "score", "lens")
KINDS = (*REQUEST_KINDS, *INSPECTION_KINDS, "switch")
WEIGHTS = {
    "generate": 36,
    "no_kv": 9,
    "choices": 10,
    "beam": 7,
    "handoff": 10,
    "teacher_force": 9,
    "score": 6,
    "lens": 7,
    "switch": 3,
}
TOP_N = 20  # the raw alternatives each step reports and the fuzz compares


@dataclass(frozen=True)
class Case:
    index: int
    kind: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    arrive_at: int  # the fuzzed engine's step count when it is added (or run, for an inspection)
    num_choices: int = 1
    cancel_after: int | None = None  # cancelled once its (first) stream has this many tokens
    answer_ids: tuple[int, ...] = ()  # teacher_force: the tokens forced after the prompt
    client: str = ""  # who asked: several clients share each step's prefill budget (a fair round)

    @property
    def is_inspection(self) -> bool:
        return self.kind in INSPECTION_KINDS

    def recipe(self) -> dict[str, Any]:
        """Everything that defines the case, as plain data (the mismatch report prints it)."""
        params = {k: v for k, v in self.params.to_dict().items() if v != getattr(DEFAULTS, k)}
        recipe: dict[str, Any] = {"index": self.index, "kind": self.kind, "arrive_at": self.arrive_at}
        recipe["prompt_ids"] = list(self.prompt_ids)
        recipe["params"] = params
        if self.num_choices > 1:
            recipe["num_choices"] = self.num_choices
        if self.cancel_after is not None:
            recipe["cancel_after"] = self.cancel_after
        if self.answer_ids:
            recipe["answer_ids"] = list(self.answer_ids)
        if self.client:
            recipe["client"] = self.client
        return recipe

    def summary(self) -> str:
        """One line: what ran beside a mismatching case."""
        extra = f" n={self.num_choices}" if self.num_choices > 1 else ""
        extra += f" beams={self.params.num_beams}" if self.params.num_beams > 1 else ""
        extra += f" cancel_after={self.cancel_after}" if self.cancel_after is not None else ""
        extra += "" if self.params.use_prefix_cache else " prefix_cache=off"
        extra += "" if self.params.use_kv_cache else " kv_cache=off"
        extra += f" client={self.client}" if self.client else ""
        return f"#{self.index} {self.kind} at step {self.arrive_at}, {len(self.prompt_ids)} prompt tokens{extra}"


DEFAULTS = SamplingParams()


@dataclass(frozen=True)
class Material:
    """What prompts and stop strings are made of, for one model."""

    bases: tuple[tuple[int, ...], ...]  # long token sequences; prompts are cut from them
    tail_ids: tuple[int, ...]  # tokens a prompt's diverging tail is drawn from
    stops: tuple[str, ...]  # stop strings this model's text often contains
    max_prompt_tokens: int


def shuffled_bases(seed: int, bases: tuple[tuple[int, ...], ...], block_size: int, num: int, length: int) -> tuple:
    """`num` bases made of the same `block_size`-token pieces in other orders: equal blocks behind
    different prefixes (a system prompt's blocks at another offset of a conversation), which only
    a prefix cache keyed by the whole prefix, not by the block's own tokens, tells apart."""
    rng = random.Random(seed)
    pieces = [base[i : i + block_size] for base in bases for i in range(0, len(base) - block_size + 1, block_size)]
    words = rng.sample(pieces, k=min(4, len(pieces)))
    return tuple(tuple(t for _ in range(length // block_size) for t in rng.choice(words)) for _ in range(num))


def random_cases(seed: int, num_cases: int, material: Material, max_new_tokens: int) -> list[Case]:
    """`num_cases` cases arriving in bursts (0 to 3 steps apart), kinds drawn by `WEIGHTS`."""
    rng = random.Random(seed)
    kinds, weights = zip(*WEIGHTS.items())
    cases: list[Case] = []
    step = 0
    for index in range(num_cases):
        # Sometimes the previous prompt again, in the same step (the lesson runs one prompt greedy
        # and beam, with and without the cache, at once): two prefills of one prefix side by side.
        again = cases[-1].prompt_ids if cases and rng.random() < 0.2 else None
        step += 0 if again else rng.choice((0, 0, 1, 1, 2, 3))
        kind = rng.choices(kinds, weights)[0]
        cases.append(_case(rng, index, kind, step, material, max_new_tokens, again))
    return cases


def _case(
    rng: random.Random, index: int, kind: str, step: int, material: Material, max_new: int, prompt: tuple | None
) -> Case:
    prompt = prompt or _prompt(rng, material)
    params = _params(rng, material, max_new)
    case = Case(index, kind, prompt, params, step, client=rng.choice(("", "a", "b")))
    if kind == "no_kv":
        case = replace(case, params=replace(params, use_kv_cache=False))
    elif kind == "choices":
        case = replace(case, num_choices=rng.randint(2, 3))
    elif kind == "beam":
        beams = rng.randint(2, 3)
        beam_params = SamplingParams(
            max_new_tokens=params.max_new_tokens,
            num_beams=beams,
            num_return_sequences=rng.randint(1, beams),
            length_penalty=rng.choice((1.0, 0.5)),
            early_stopping=rng.random() < 0.5,
            ignore_eos=params.ignore_eos,
            use_prefix_cache=params.use_prefix_cache,
            use_kv_cache=rng.random() < 0.8,
            num_alternatives=TOP_N,
        )
        case = replace(case, params=beam_params)
    elif kind == "handoff":
        case = replace(case, params=replace(params, use_kv_cache=True))
    elif kind == "teacher_force":
        tail = material.tail_ids
        case = replace(case, answer_ids=tuple(rng.choice(tail) for _ in range(rng.randint(1, max_new))))
    if kind in REQUEST_KINDS and rng.random() < 0.15:
        case = replace(case, cancel_after=rng.randint(0, case.params.max_new_tokens))
    return case


def _prompt(rng: random.Random, material: Material) -> tuple[int, ...]:
    """A cut of a base (a prefix another prompt may share, to any length), maybe a diverging tail."""
    base = rng.choice(material.bases)
    cut = rng.choice((len(base), rng.randint(1, len(base)), rng.randint(1, len(base))))
    tail = [rng.choice(material.tail_ids) for _ in range(rng.choice((0, 0, 1, 3, 8)))]
    return tuple([*base[:cut], *tail][: material.max_prompt_tokens]) or (material.tail_ids[0],)


def _params(rng: random.Random, material: Material, max_new: int) -> SamplingParams:
    greedy = rng.random() < 0.35
    return SamplingParams(
        max_new_tokens=rng.randint(1, max_new),
        greedy=greedy,
        temperature=rng.choice((1.0, 1.0, 0.7, 1.3)),
        top_k=rng.choice((0, 0, 5, 40)),
        top_p=rng.choice((1.0, 1.0, 0.9)),
        min_p=rng.choice((0.0, 0.0, 0.05)),
        repetition_penalty=rng.choice((1.0, 1.0, 1.0, 1.3)),
        seed=rng.randrange(2**31),
        num_alternatives=TOP_N,
        stop=tuple(rng.sample(material.stops, k=min(3, len(material.stops)))) if rng.random() < 0.3 else (),
        ignore_eos=rng.random() < 0.5,
        use_prefix_cache=rng.random() < 0.75,
    )
