"""Determinism benchmark: the same request gives the same tokens and probabilities however it is served.

`python -m inference.bench determinism [--quick]` (or `python -m inference.bench.determinism`).

Owns: the check, through the serving path (`Engine.add_request`/`step`) on the bundled model, in
the default precision and in int4: N chat prompts, each run greedy and seeded (temperature 1,
its own seed), first cold and alone (the reference), then
- warm: again, its prompt served from the prefix cache (a one-token run left it there),
- batched: in a batch of 8 with other prompts, arriving one every two steps,
- chunked: alone on an engine with a small token budget (the prompt prefilled in chunks),
each compared token by token and on the top-20 raw logprobs of every step with the reference.
The cost side: each cold greedy run is also timed in the fast mode (`batch_invariant=False`:
torch's float matmuls and prompt attention), interleaved with the default one, so machine noise
hits both. The last line is `key=value`: `greedy_identical` and `seeded_identical` (fractions of
runs whose tokens equal the reference's), `max_abs_logprob_diff` (the largest difference of a
top-20 logprob, over every compared step, 0.0 when bitwise equal), `decode_cost_ratio` (the
default mode's decode tok/s over the fastest mode's, default precision) and per precision.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, replace

import torch

from inference.bench import format_keys
from inference.config import EngineConfig
from inference.engine import Engine
from inference.events import Finished, Step
from inference.models.loader import LoadedModel, load_model
from inference.sampling_params import SamplingParams

TOPICS = [
    "the capital of France", "why the sky is blue", "how bees make honey", "photosynthesis", "black holes",
    "the moon landing", "a good cup of tea", "the history of Rome", "how a steam engine works", "the water cycle",
    "the rules of chess", "how a bicycle stays upright", "volcanoes", "the printing press", "rainbows",
    "how vaccines work", "the Great Wall of China", "penguins", "the internet", "earthquakes",
    "the first airplane", "coral reefs", "how clocks work", "the Olympic Games", "autumn leaves",
]  # fmt: skip
FORMS = ("Tell me about {}.", "Write a short story about {}.")
BATCH_SIZE = 8
VARIANTS = ("warm", "batched", "chunked")
CHUNK_TOKENS = 16  # the chunked engine's token budget per step


def questions(num: int) -> list[str]:
    """`num` distinct chat questions (two forms of 25 topics)."""
    return [FORMS[i // len(TOPICS) % len(FORMS)].format(TOPICS[i % len(TOPICS)]) for i in range(num)]


@dataclass
class Run:
    token_ids: list[int]
    top: list[list[tuple[int, float]]]  # per step: the top-20 raw (token, logprob)
    decode_tok_s: float = 0.0


def run_requests(engine: Engine, requests: list[tuple[list[int], SamplingParams]], arrive_every: int = 0) -> list[Run]:
    """Serves the requests (all at once, or one every `arrive_every` steps) and collects each one's steps."""
    ids: list[int] = []
    runs: dict[int, Run] = {}
    pending, num_steps = list(requests), 0
    while pending or engine.has_unfinished:
        if pending and (arrive_every == 0 or num_steps % arrive_every == 0):
            for prompt_ids, params in pending if arrive_every == 0 else pending[:1]:
                ids.append(engine.add_request(prompt_ids, params))
                runs[ids[-1]] = Run([], [])
            pending = [] if arrive_every == 0 else pending[1:]
        for request_id, event in engine.step():
            if isinstance(event, Step):
                runs[request_id].token_ids.append(event.token_id)
                runs[request_id].top.append([(a.token_id, a.logprob) for a in event.top_raw])
            elif isinstance(event, Finished):
                runs[request_id].decode_tok_s = event.decode_tok_s
        num_steps += 1
    return [runs[i] for i in ids]


def compare(reference: Run, other: Run) -> tuple[bool, float]:
    """(same tokens, the largest difference between the two runs' k-th most likely logprobs, over
    the steps both reached with the same tokens so far: 0.0 when they are bitwise equal)."""
    diff = 0.0
    for step, (want, got) in enumerate(zip(reference.top, other.top)):
        diff = max([diff, *(abs(a[1] - b[1]) for a, b in zip(want, got))])
        if reference.token_ids[step] != other.token_ids[step]:
            break
    return reference.token_ids == other.token_ids, diff


def check_precision(loaded: LoadedModel, prompts: list[list[int]], num_tokens: int) -> dict[str, float]:
    """Every variant of every prompt against its cold alone run, greedy and seeded; decode speed of
    the default and the fast mode."""
    cached = Engine(loaded, EngineConfig())  # its prefix cache is the batch's KV blocks
    chunked = Engine(loaded, EngineConfig(max_num_batched_tokens=CHUNK_TOKENS))
    fast = Engine(loaded, EngineConfig(batch_invariant=False))
    base = SamplingParams(max_new_tokens=num_tokens, ignore_eos=True, num_alternatives=20, use_prefix_cache=False)
    out: dict[str, float] = {"batch_invariant": float(cached.model_info()["batch_invariant"])}
    speed = {"default": [0.0, 0.0], "fast": [0.0, 0.0]}  # tokens, seconds
    for kind in ("greedy", "seeded"):
        params = [replace(base, greedy=True) if kind == "greedy" else replace(base, temperature=1.0, seed=1000 + i)
                  for i in range(len(prompts))]  # fmt: skip
        cold = []
        for prompt_ids, p in zip(prompts, params):
            cold += run_requests(cached, [(prompt_ids, p)])
            if kind == "greedy":  # the fast mode on the same request, right after: noise hits both
                fast_run = run_requests(fast, [(prompt_ids, p)])[0]
                for mode, run in (("default", cold[-1]), ("fast", fast_run)):
                    speed[mode][0] += num_tokens - 1
                    speed[mode][1] += (num_tokens - 1) / run.decode_tok_s
        variants: dict[str, list[Run]] = {"warm": [], "batched": [], "chunked": []}
        for prompt_ids, p in zip(prompts, params):
            warm = replace(p, use_prefix_cache=True)
            run_requests(cached, [(prompt_ids, replace(warm, max_new_tokens=1))])  # leaves its blocks cached
            variants["warm"] += run_requests(cached, [(prompt_ids, warm)])
            variants["chunked"] += run_requests(chunked, [(prompt_ids, p)])
        for start in range(0, len(prompts), BATCH_SIZE):  # with others, arriving one every two steps
            group = list(zip(prompts, params))[start : start + BATCH_SIZE]
            variants["batched"] += run_requests(cached, group, arrive_every=2)
        identical = 0
        for name, runs in variants.items():
            same = [compare(c, r) for c, r in zip(cold, runs)]
            num_same = sum(s for s, _ in same)
            diff = max(d for _, d in same)
            identical += num_same
            out[f"{kind}_{name}_identical"] = num_same / len(runs)
            out[f"{kind}_{name}_max_diff"] = diff
            print(f"  {kind:<7} {name:<8} {num_same:>3}/{len(runs)} runs identical  max |logprob diff| {diff:.3g}")
        out[f"{kind}_identical"] = identical / (len(VARIANTS) * len(prompts))
    for mode, (tokens, seconds) in speed.items():
        out[f"decode_tok_s_{mode}"] = tokens / seconds
    out["decode_cost_ratio"] = out["decode_tok_s_default"] / max(out["decode_tok_s_default"], out["decode_tok_s_fast"])
    print(
        f"  decode (cold greedy runs, interleaved): default {out['decode_tok_s_default']:.1f} tok/s, "
        f"fast mode {out['decode_tok_s_fast']:.1f} tok/s"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench determinism", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 prompts x 16 tokens (a few minutes)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precisions", default="auto,int4", help="comma-separated; the first is the default one")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    num_prompts = args.num_prompts or (8 if args.quick else 50)
    num_tokens = args.max_new_tokens or (16 if args.quick else 64)
    precisions = args.precisions.split(",")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"{num_prompts} prompts x {num_tokens} tokens, greedy and seeded (temperature 1), each cold alone, then "
        f"warm / in a batch of {BATCH_SIZE} / chunked ({CHUNK_TOKENS}-token budget); "
        f"threads={torch.get_num_threads()}, load average {load:.1f}"
    )
    results: dict[str, float | str] = {}
    per_precision = {}
    for precision in precisions:
        loaded = load_model(EngineConfig(source="bundled", device=args.device, dtype=precision))
        name = loaded.precision or str(loaded.dtype).removeprefix("torch.")
        engine = Engine(loaded, EngineConfig())
        prompts = [
            engine.prompts.build(messages=[{"role": "user", "content": q}]).token_ids for q in questions(num_prompts)
        ]
        print(f"{name} ({precision}):")
        started = time.perf_counter()
        per_precision[name] = check_precision(loaded, prompts, num_tokens)
        print(f"  ({time.perf_counter() - started:.0f} s)")
    default = per_precision[next(iter(per_precision))]
    results["default_precision"] = next(iter(per_precision))
    for key in ("greedy_identical", "seeded_identical"):
        results[key] = min(r[key] for r in per_precision.values())
    results["max_abs_logprob_diff"] = max(
        r[f"{k}_{v}_max_diff"] for r in per_precision.values() for k in ("greedy", "seeded") for v in VARIANTS
    )
    results["decode_cost_ratio"] = default["decode_cost_ratio"]
    for name, r in per_precision.items():
        results[f"greedy_identical_{name}"] = r["greedy_identical"]
        results[f"seeded_identical_{name}"] = r["seeded_identical"]
        results[f"decode_cost_ratio_{name}"] = r["decode_cost_ratio"]
        results[f"decode_tok_s_{name}"] = r["decode_tok_s_default"]
    print(format_keys(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
