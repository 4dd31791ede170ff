"""Differential fuzz of the whole served path: `python -m inference.bench fuzz [--quick] [--seed N]
[--model bundled|bundled:<name>|tiny-<arch>] [--cases N]`.

One engine (a small KV pool, so requests are preempted and recomputed; a small token budget, so
prompts are prefilled in chunks) takes a seeded random mix arriving between its steps
(`fuzz_cases.py`): prompts sharing and diverging from each other's prefixes, the prefix cache on
and off, no-KV-cache runs, n choices, beams, stop strings, cancels, PD handoffs (prefilled on a
second engine, imported through the blob format), the explorer's and the lesson's inspections
(teacher forcing, prompt scores, the logit lens) stepping the batch between their chunks, and a
second model or precision loaded, run and dropped in the same process (`fuzz_drive.py`). Every
request's tokens and top-20 raw logprobs (each `Step`'s; a beam search's `BeamStep`s) and every
inspection's logits are then compared bitwise with the same request run alone on a cold engine
(the same model and settings, its prefix cache emptied before each run); a cancelled request on
the prefix it produced. Owns: the reference runs, the comparison and the report. The last line:
`fuzz_requests=N fuzz_mismatches=M ...`; above it, the first mismatch's recipe (the seed that
replays the whole run, the case, what ran beside it).
Must not know: Django, the worker.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from inference.bench import format_keys
from inference.bench.fuzz_cases import Case, random_cases
from inference.bench.fuzz_drive import Drive, Observed
from inference.bench.fuzz_subjects import Subject, bundled_subject, tiny_subject
from inference.engine import Engine
from inference.events import BeamStep, Finished, Step
from inference.sampling_params import MAX_SEED

# Errors that are the engine's documented limits, not differences: a preempted group (beams that
# each recompute their own copy of the prompt) that no longer fits the fuzzed engine's small pool.
REFUSALS = ("cannot start on this worker",)


@dataclass(frozen=True)
class Mismatch:
    case: Case
    detail: str
    beside: tuple[Case, ...]


@dataclass
class Report:
    seed: int
    cases: list[Case]
    mismatches: list[Mismatch] = field(default_factory=list)
    refused: list[Mismatch] = field(default_factory=list)
    num_compared: int = 0
    num_streams: int = 0
    stats: dict[str, Any] = field(default_factory=dict)


class Reference:
    """Each request alone on a cold engine: the same model and settings, nothing cached."""

    def __init__(self, subject: Subject) -> None:
        self.engine = Engine(subject.loaded, subject.reference_config)
        self.memo: dict[tuple, list[Any]] = {}

    def _cold(self) -> Engine:
        assert not self.engine.has_unfinished
        self.engine.core.block_manager.reset_prefix_cache()
        return self.engine

    def events(self, prompt_ids: tuple[int, ...], params) -> list[Any]:
        key = (prompt_ids, params)
        if key not in self.memo:
            self.memo[key] = list(self._cold().generate(list(prompt_ids), params))
        return self.memo[key]

    def tensor(self, case: Case) -> torch.Tensor:
        passes, prompt = self._cold().passes, list(case.prompt_ids)
        if case.kind == "teacher_force":
            return passes.teacher_force(prompt, list(case.answer_ids))
        if case.kind == "score":
            parts: list[torch.Tensor] = []
            passes.score(prompt, lambda start, logits: parts.append(logits.clone()), max_rows=16)
            return torch.cat(parts)
        return passes.read_layers(prompt)

    def streams(self, case: Case) -> list[list[Any]]:
        """The events each of the case's streams must give: a choice's are its own seed's alone."""
        if case.kind != "choices":
            return [self.events(case.prompt_ids, case.params)]
        seeds = [(case.params.seed + i) % (MAX_SEED + 1) for i in range(case.num_choices)]
        return [self.events(case.prompt_ids, replace(case.params, seed=seed)) for seed in seeds]


def numbers(events: list[Any]) -> list[tuple]:
    """Per step, what must be bitwise equal: the token, its logprobs, the top-20 raw (token,
    logprob); a beam step's beams. Floats as hex, so equal means equal bits (NaN included)."""
    out: list[tuple] = []
    for e in events:
        if isinstance(e, Step):
            top = tuple((a.token_id, a.logprob.hex()) for a in e.top_raw)
            out.append((e.token_id, e.logprob.hex(), e.raw_logprob.hex(), top))
        elif isinstance(e, BeamStep):
            out.append(tuple(_beam(b) for b in e.beams))
    return out


def _beam(beam) -> tuple:
    return (
        beam.token_ids,
        tuple(x.hex() for x in beam.token_logprobs),
        beam.score.hex(),
        beam.parent,
        beam.is_finished,
    )


def ending(events: list[Any]) -> tuple:
    end = events[-1]
    return (end.finish_reason, end.text, end.token_ids, tuple(_beam(b) for b in end.sequences))


def compare_stream(got: list[Any], want: list[Any]) -> str | None:
    """None when `got` is `want` (a cancelled stream: a prefix of it); else what differs."""
    if not got or not isinstance(got[-1], Finished):
        return "no Finished event"
    if got[-1].finish_reason == "error":
        return f"ended with an error: {got[-1].error}"
    a, b = numbers(got), numbers(want)
    if got[-1].finish_reason == "cancelled":
        b = b[: len(a)]
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"step {k}: got {_short(x)}, alone {_short(y)}"
    if len(a) != len(b):
        return f"{len(a)} steps, alone {len(b)}"
    if got[-1].finish_reason != "cancelled" and ending(got) != ending(want):
        return f"ended {ending(got)[:3]!r}, alone {ending(want)[:3]!r}"
    return None


def _short(step: tuple) -> str:
    if isinstance(step[0], int):  # a Step: the token and the top 3 raw
        return f"token {step[0]} (top {[(i, float.fromhex(lp)) for i, lp in step[3][:3]]})"
    return f"beams {[b[0] for b in step]}"


def compare_tensor(got: torch.Tensor | None, want: torch.Tensor) -> str | None:
    if got is None:
        return "no output"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)}, alone {tuple(want.shape)}"
    if torch.equal(got, want):
        return None
    diff = (got - want).abs().nan_to_num(float("inf"))
    return f"logits differ: max |diff| {diff.max().item():.4g} at {divmod(int(diff.argmax()), want.shape[-1])}"


def run_fuzz(subject: Subject, seed: int, num_cases: int, max_new_tokens: int = 12) -> Report:
    """Drives the mix on one engine, then checks every case against the cold reference."""
    cases = random_cases(seed, num_cases, subject.material, max_new_tokens)
    engine, prefill_engine = subject.engine(), subject.engine()
    observed = Drive(subject, engine, prefill_engine).run(cases)
    report = Report(seed, cases, stats=_stats(engine, observed))
    reference = Reference(subject)
    for case in cases:
        if case.kind == "switch" or case.index in observed.given_up:
            continue
        detail = _check(case, observed, reference)
        report.num_compared += 1
        report.num_streams += len(observed.streams.get(case.index, ())) or 1
        if detail is not None:
            found = Mismatch(case, detail, _beside(case, cases, observed))
            (report.refused if any(r in detail for r in REFUSALS) else report.mismatches).append(found)
    return report


def _check(case: Case, observed: Observed, reference: Reference) -> str | None:
    if case.index in observed.errors:
        return f"raised {observed.errors[case.index]}"
    if case.is_inspection:
        return compare_tensor(observed.tensors.get(case.index), reference.tensor(case))
    for choice, (got, want) in enumerate(zip(observed.streams[case.index], reference.streams(case))):
        detail = compare_stream(got, want)
        if detail is not None:
            return f"choice {choice}: {detail}" if case.num_choices > 1 else detail
    return None


def _beside(case: Case, cases: list[Case], observed: Observed) -> tuple[Case, ...]:
    first, last = observed.spans.get(case.index, (case.arrive_at, case.arrive_at))
    return tuple(
        other
        for other in cases
        if other is not case
        and other.index in observed.spans
        and observed.spans[other.index][0] <= last
        and observed.spans[other.index][1] >= first
    )


def _stats(engine: Engine, observed: Observed) -> dict[str, Any]:
    cache = engine.prefix_cache_stats()
    return {
        "steps": observed.num_steps,
        "preemptions": engine.core.scheduler.num_preemptions,
        "prefix_hits": cache["hits"],
        "cached_tokens": cache["num_cached_tokens"],
        "evictions": cache["num_evictions"],
        "inspections_given_up": len(observed.given_up),
    }


def recipe(report: Report, mismatch: Mismatch, replay: str) -> str:
    lines = [
        f"first mismatch: case #{mismatch.case.index} ({mismatch.case.kind}): {mismatch.detail}",
        f"  replay (the whole run is deterministic): {replay}",
        f"  the case: {json.dumps(mismatch.case.recipe(), ensure_ascii=False)}",
        f"  beside it ({len(mismatch.beside)} cases live in the same steps):",
        *(f"    {other.summary()}" for other in mismatch.beside[:40]),
    ]
    return "\n".join(lines)


def load_subject(model: str, dtype: str) -> Subject:
    if model.startswith("tiny-"):
        return tiny_subject(model.removeprefix("tiny-"))
    return bundled_subject(model, dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="240 cases of up to 8 tokens (a few minutes)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="bundled", help="bundled, bundled:<name> or tiny-<arch>")
    parser.add_argument("--dtype", default="auto", help="the bundled model's precision")
    parser.add_argument("--cases", type=int, default=None, help="how many cases (default 240 quick, 1000 full)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    num_cases = args.cases or (240 if args.quick else 1000)
    max_new = args.max_new_tokens or (8 if args.quick else 16)
    started = time.perf_counter()
    subject = load_subject(args.model, args.dtype)
    print(f"fuzzing {subject.describe(subject.engine())}: {num_cases} cases, seed {args.seed}", flush=True)
    report = run_fuzz(subject, args.seed, num_cases, max_new)
    kinds = Counter(case.kind for case in report.cases)
    print("cases: " + ", ".join(f"{kind} {n}" for kind, n in sorted(kinds.items())))
    print("engine: " + ", ".join(f"{k} {v}" for k, v in report.stats.items()))
    for refused in report.refused[:3]:
        print(f"refused (a limit of the small pool): {refused.case.summary()}: {refused.detail}")
    if report.mismatches:
        replay = f"python -m inference.bench fuzz --model {args.model} --dtype {args.dtype} --seed {args.seed} "
        replay += f"--cases {num_cases} --max-new-tokens {max_new}"
        print(recipe(report, report.mismatches[0], replay))
        for other in report.mismatches[1:10]:
            print(f"  also #{other.case.index} ({other.case.kind}): {other.detail}")
    results = {
        "fuzz_requests": report.num_compared,
        "fuzz_streams": report.num_streams,
        "fuzz_mismatches": len(report.mismatches),
        "fuzz_refused": len(report.refused),
        "fuzz_seed": args.seed,
        "fuzz_preemptions": report.stats["preemptions"],
        "fuzz_prefix_hits": report.stats["prefix_hits"],
        "fuzz_s": time.perf_counter() - started,
    }
    print(format_keys(results))
    return 1 if report.mismatches else 0


if __name__ == "__main__":
    raise SystemExit(main())
