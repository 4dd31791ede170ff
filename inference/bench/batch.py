"""Continuous batching benchmark: N concurrent streams through the engine, against one stream.

`python -m inference.bench batch [--quick] [--model bundled|tiny-gemma3|tiny-gpt2|...|PATH] [--dtype D]`
(or `python -m inference.bench.batch`).

Owns: the workload (distinct prompts, a fixed number of new tokens each, top-20 alternatives
computed every step as the playground does) and the side by side, in one process: for 1, 4, 8
(and 16) streams, aggregate tokens/s, time to first token p50/p95 (from the moment all N
arrived) and inter-token latency p50/p99, each count's best of `--repeats` interleaved runs. The
last line is `key=value` pairs:
`batch_speedup_N` is the N-stream aggregate over the one-stream rate; `single_stream_ratio` is
one stream's decode speed through the engine over a bare decode loop on the same runner (one
forward pass and one sampling call per token, no scheduler, no records): what the engine's
bookkeeping costs a lone user. `--model tiny-<arch>` builds a small random model of that
architecture from its config (`inference.models.tiny`, scale 8): no download, and every
architecture the engine serves through the transformers runner can be measured.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from inference.bench import format_keys, percentile
from inference.config import EngineConfig
from inference.core.scheduler import Chunk
from inference.core.sequence import Sequence
from inference.engine import Engine
from inference.events import Step
from inference.models.loader import LoadedModel, resolve_device
from inference.models.precision import (
    QUANTIZED_BITS,
    activation_dtype,
    load_dtype,
    quantize_model,
    resolve_precision,
)
from inference.models.tiny import TINY_ARCHITECTURES, make_tiny_model, make_tiny_tokenizer
from inference.sampling.sampler import Row, Sampler, sample_rows
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
    if not engine.loaded.chat_template:  # a random model: random prompts of chat length
        generator = torch.Generator().manual_seed(n)
        return [torch.randint(0, 256, (40,), generator=generator, device=generator.device).tolist() for _ in range(n)]
    chats = [[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}] for i in range(n)]
    return [engine.prompts.encode(engine.prompts.render_chat(chat).text) for chat in chats]


def summarize(token_times: list[list[float]], started: float, ended: float) -> dict[str, float]:
    """token_times[i]: when each token of request i came out (the stack benchmark reads its
    clients' tokens the same way)."""
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
    return summarize([times[i] for i in ids], started, time.perf_counter())


def bare_decode_tok_s(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> float:
    """One stream decoding on the runner directly: a forward pass and a sampling call per token."""
    core, num_tokens = engine.core, params.max_new_tokens
    seq = Sequence(list(prompt_ids), params)
    core.block_manager.allocate(seq)
    sampler = Sampler(params, engine.device)
    try:
        chunk = Chunk(seq, 0, seq.num_tokens, True, "prefill")
        started = 0.0
        for _ in range(num_tokens):
            logits = engine.runner.run([chunk]).logits
            token_id = sample_rows(logits, [Row(sampler, seq.token_ids, None, params.num_alternatives)])[0].token_id
            started = started or time.perf_counter()  # from the first token on: decode only
            seq.num_computed_tokens = seq.num_tokens
            seq.append_token(token_id)
            core.block_manager.append_slots(seq, seq.num_tokens)
            chunk = Chunk(seq, seq.num_tokens - 1, 1, True, "decode")
        return (num_tokens - 1) / (time.perf_counter() - started)
    finally:
        core.block_manager.deallocate(seq)


def single_stream_ratio(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> float:
    """Best of 3 interleaved runs per side: one stream's speed is what machine noise moves most."""
    best = {"engine": 0.0, "bare": 0.0}
    for _ in range(3):
        best["engine"] = max(best["engine"], run_batched(engine, [prompt_ids], params)["decode_tok_s_first"])
        best["bare"] = max(best["bare"], bare_decode_tok_s(engine, prompt_ids, params))
    return best["engine"] / best["bare"]


def load(model: str, device: str, dtype: str, max_num_seqs: int) -> Engine:
    """The engine for `--model`: "bundled", "tiny-<arch>" (random weights from a config) or a source."""
    config = EngineConfig(source="bundled", device=device, dtype=dtype, max_num_seqs=max_num_seqs)
    if not model.startswith("tiny-"):
        return Engine.load(EngineConfig(**{**config.__dict__, "source": model}))
    arch = model.removeprefix("tiny-")
    if arch not in TINY_ARCHITECTURES:
        raise SystemExit(f"--model {model}: tiny models are tiny-{', tiny-'.join(TINY_ARCHITECTURES)}")
    torch_device = resolve_device(device)
    precision = resolve_precision(dtype, torch_device)
    torch_dtype = activation_dtype(precision, torch_device)
    tiny = make_tiny_model(arch, scale=8).to(device=torch_device, dtype=load_dtype(precision, torch_device))
    quantization = quantize_model(tiny, precision, torch_dtype) if precision in QUANTIZED_BITS else None
    loaded = LoadedModel(
        model=tiny,
        tokenizer=make_tiny_tokenizer(),
        name=model,
        source_path=Path("."),
        dtype=torch_dtype,
        device=torch_device,
        chat_template=None,
        max_context=tiny.config.max_position_embeddings,
        eos_token_ids=(),
        precision=precision,
        quantization=quantization,
    )
    return Engine(loaded, config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench batch", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1, 4 and 8 streams, 32 tokens (about a minute)")
    parser.add_argument("--model", default="bundled", help="bundled, tiny-<arch> or a model source")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each stream count, interleaved: the best kept")
    args = parser.parse_args(argv)
    num_tokens = args.max_new_tokens or (32 if args.quick else 64)
    stream_counts = (1, 4, 8) if args.quick else (1, 4, 8, 16)
    engine = load(args.model, args.device, args.dtype, max(stream_counts))
    params = SamplingParams(
        greedy=True, max_new_tokens=num_tokens, ignore_eos=True, num_alternatives=20, use_prefix_cache=False
    )
    run_batched(engine, prompts(engine, 2), params)  # warm up
    print(
        f"model {engine.info.name} ({engine.info.precision}, {engine.device}, {engine.runner.name} runner), "
        f"{num_tokens} new tokens per stream, top-20 alternatives every step; times in ms"
    )
    print(f"{'streams':>7} {'tok/s':>8} {'ttft p50':>9} {'ttft p95':>9} {'itl p50':>8} {'itl p99':>8}")
    best: dict[int, dict[str, float]] = {}
    for _ in range(args.repeats):  # interleaved, the best run of each count: machine noise moves single runs most
        for n in stream_counts:
            r = run_batched(engine, prompts(engine, n), params)
            if n not in best or r["tok_s"] > best[n]["tok_s"]:
                best[n] = r
    results: dict[str, float] = {}
    for n in stream_counts:
        r = best[n]
        print(
            f"{n:>7} {r['tok_s']:>8.1f} {r['ttft_p50']:>9.0f} {r['ttft_p95']:>9.0f} "
            f"{r['itl_p50']:>8.1f} {r['itl_p99']:>8.1f}"
        )
        results.update(
            {
                f"aggregate_tok_s_{n}": r["tok_s"],
                f"batch_speedup_{n}": r["tok_s"] / best[stream_counts[0]]["tok_s"],
                f"ttft_p95_ms_{n}": r["ttft_p95"],
                f"itl_p99_ms_{n}": r["itl_p99"],
            }
        )
    results["single_stream_ratio"] = single_stream_ratio(engine, prompts(engine, 1)[0], params)
    print(format_keys(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
