"""Continuous batching benchmark: N concurrent streams through the batching engine vs the same
N requests one after another on the batch-1 path.

`python -m inference.bench batch [--quick]` (or `python -m inference.bench.batch`).

Owns: the workload (distinct chat prompts on the bundled model, a fixed number of new
tokens each, top-20 alternatives computed every step as the playground does) and the side
by side, in one process: for 1, 4, 8 and 16 streams, aggregate tokens/s, time to first
token p50/p95 (from the moment all N arrived) and inter-token latency p50/p99. Both paths
share the weights, so machine noise hits both alike. The last line is `key=value` pairs:
`batch_speedup_8` is the 8-stream aggregate over the same 8 requests run one after another
on the batch-1 path; `single_stream_ratio` is one stream's decode speed, batching engine
over batch-1 path (what batching costs a lone user).
"""

from __future__ import annotations

import argparse
import time

from inference.bench import format_keys, percentile
from inference.config import EngineConfig
from inference.engine import Engine
from inference.events import Step
from inference.sampling_params import SamplingParams

QUESTIONS = [
    "Write a long story about a lighthouse keeper.",
    "Explain how a steam engine works.",
    "Describe the water cycle to a child.",
    "What makes a good cup of tea?",
    "Tell me about the history of Rome.",
    "How do bees make honey?",
    "Write a poem about autumn leaves.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "Explain photosynthesis step by step.",
    "What is a black hole?",
    "Describe a walk through a busy market.",
    "How does a bicycle stay upright?",
    "Write a letter to a pen pal.",
    "What are the rules of chess?",
    "Tell me about the moon landing.",
]


def prompts(engine: Engine, n: int) -> list[list[int]]:
    return [
        engine.encode(engine.render_chat([{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]).text)
        for i in range(n)
    ]


def _summary(token_times: list[list[float]], started: float, ended: float) -> dict[str, float]:
    """token_times[i]: when each token of request i came out."""
    ttft = [(times[0] - started) * 1000 for times in token_times]
    itl = [(b - a) * 1000 for times in token_times for a, b in zip(times, times[1:])]
    num_tokens = sum(len(times) for times in token_times)
    lone = token_times[0]
    return {
        "tok_s": num_tokens / (ended - started),
        "ttft_p50": percentile(ttft, 50),
        "ttft_p95": percentile(ttft, 95),
        "itl_p50": percentile(itl, 50),
        "itl_p99": percentile(itl, 99),
        "decode_tok_s_first": (len(lone) - 1) / (lone[-1] - lone[0]) if len(lone) > 1 else 0.0,
    }


def run_batched(engine: Engine, prompt_ids: list[list[int]], params: SamplingParams) -> dict[str, float]:
    started = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompt_ids]
    times: dict[int, list[float]] = {i: [] for i in ids}
    while engine.has_unfinished:
        for request_id, event in engine.step():
            if isinstance(event, Step):
                times[request_id].append(time.perf_counter())
    return _summary([times[i] for i in ids], started, time.perf_counter())


def run_one_by_one(engine: Engine, prompt_ids: list[list[int]], params: SamplingParams) -> dict[str, float]:
    started = time.perf_counter()
    token_times = []
    for p in prompt_ids:
        times = []
        for event in engine.generate(p, params):
            if isinstance(event, Step):
                times.append(time.perf_counter())
        token_times.append(times)
    return _summary(token_times, started, time.perf_counter())


RUNS = {"batching": run_batched, "batch-1": run_one_by_one}


def single_stream_ratio(engine: Engine, prompt_ids: list[list[int]], params: SamplingParams, first: dict) -> float:
    """Best of 3 interleaved runs per path: one stream's speed is what machine noise moves most."""
    best = {path: first[path]["decode_tok_s_first"] for path in RUNS}
    for _ in range(2):
        for path, run in RUNS.items():
            best[path] = max(best[path], run(engine, prompt_ids, params)["decode_tok_s_first"])
    return best["batching"] / best["batch-1"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench batch", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1, 4 and 8 streams, 32 tokens (about a minute)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    args = parser.parse_args(argv)
    num_tokens = args.max_new_tokens or (32 if args.quick else 64)
    stream_counts = (1, 4, 8) if args.quick else (1, 4, 8, 16)
    engine = Engine.load(
        EngineConfig(
            source="bundled",
            device=args.device,
            dtype=args.dtype,
            prefix_cache_bytes=0,
            max_num_seqs=max(stream_counts),
        )
    )
    if engine.batcher is None:
        raise SystemExit(f"{engine.loaded.name}: the batched runner does not cover this model")
    params = SamplingParams(
        greedy=True, max_new_tokens=num_tokens, ignore_eos=True, num_alternatives=20, use_prefix_cache=False
    )
    run_batched(engine, prompts(engine, 2), params)  # warm up both paths
    run_one_by_one(engine, prompts(engine, 1), params)
    print(
        f"model {engine.loaded.name} ({engine.loaded.dtype}, {engine.device}), {num_tokens} new tokens per stream, "
        "top-20 alternatives every step; times in ms"
    )
    print(f"{'streams':>7} {'path':<10} {'tok/s':>8} {'ttft p50':>9} {'ttft p95':>9} {'itl p50':>8} {'itl p99':>8}")
    results: dict[str, float] = {}
    for n in stream_counts:
        batch_ids = prompts(engine, n)
        rows = {path: run(engine, batch_ids, params) for path, run in RUNS.items()}
        for path, r in rows.items():
            print(
                f"{n:>7} {path:<10} {r['tok_s']:>8.1f} {r['ttft_p50']:>9.0f} {r['ttft_p95']:>9.0f} "
                f"{r['itl_p50']:>8.1f} {r['itl_p99']:>8.1f}"
            )
        b = rows["batching"]
        results.update(
            {
                f"aggregate_tok_s_{n}": b["tok_s"],
                f"batch1_tok_s_{n}": rows["batch-1"]["tok_s"],
                f"batch_speedup_{n}": b["tok_s"] / rows["batch-1"]["tok_s"],
                f"ttft_p95_ms_{n}": b["ttft_p95"],
                f"itl_p99_ms_{n}": b["itl_p99"],
            }
        )
        if n == 1:
            results["single_stream_ratio"] = single_stream_ratio(engine, batch_ids, params, rows)
    print(format_keys(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
