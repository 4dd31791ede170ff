"""Every weight precision side by side, and llama.cpp when it is installed:
`python -m inference.bench [precision] [--quick]`.

For each precision (float32, bfloat16, int8, int4, and gguf for a GGUF model, on a CPU): decode tok/s with the top-20
distribution reported every step, prefill tok/s, weight bytes read per decode token, the fraction
of the memory-bandwidth bound that is, and the quality cost: KL divergence of the next-token
distribution against float32 and greedy agreement, teacher-forced over fixed prompts. With
`llama_cpp` importable (requirements-bench.txt), llama.cpp runs the same GGUF on the same prompt
ids and threads, with and without a top-20 distribution computed per token, interleaved with ours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.bench import format_keys
from inference.bench.decode import PROMPT, time_ours_decode, time_ours_prefill
from inference.bench.llamacpp import LlamaCppBench
from inference.config import EngineConfig
from inference.engine import Engine
from inference.introspect.device_limits import read_bandwidth
from inference.models.loader import ModelLoadError, gguf_source
from inference.models.precision import decode_read_bytes, resolve_precision
from inference.sampling_params import SamplingParams

QUALITY_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain why the sky is blue in two sentences.",
    "List three fruits that are red.",
    "How do I boil an egg?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 7?",
    "Give me a name for a grey cat.",
)


@dataclass(frozen=True)
class QualityCase:
    """One fixed prompt + the reference's greedy answer, and the reference's next-token logprobs
    at every answer position: computed once, compared with every precision."""

    ids: torch.Tensor  # (1, P + N) prompt + answer
    num_prompt_tokens: int
    reference_logprobs: torch.Tensor  # (N, V)


def quality_cases(reference: Engine, num_tokens: int) -> list[QualityCase]:
    """The reference's greedy answers to QUALITY_PROMPTS and its distributions along them."""
    params = SamplingParams(greedy=True, max_new_tokens=num_tokens, ignore_eos=True, use_prefix_cache=False)
    cases = []
    for question in QUALITY_PROMPTS:
        prompt_ids = reference.prompts.encode(
            reference.prompts.render_chat([{"role": "user", "content": question}]).text
        )
        answer = list(list(reference.generate(prompt_ids, params))[-1].token_ids)
        ids = torch.tensor([prompt_ids + answer])
        cases.append(QualityCase(ids, len(prompt_ids), answer_logprobs(reference, ids, len(prompt_ids))))
    return cases


def answer_logprobs(engine: Engine, ids: torch.Tensor, num_prompt_tokens: int) -> torch.Tensor:
    """Teacher-forced next-token logprobs (N, V) at every answer position of `ids` (1, P + N), from
    the served path: the engine's runner, a prefill then one decode step per answer token, so the
    numbers are the ones a chat's steps report (its kernels and rounding, not transformers')."""
    prompt_ids, answer = ids[0, :num_prompt_tokens].tolist(), ids[0, num_prompt_tokens:-1].tolist()
    logits = engine.passes.teacher_force(prompt_ids, answer)  # (N, V)
    return torch.log_softmax(logits.float().cpu(), -1)


def quality(cases: list[QualityCase], engine: Engine) -> tuple[float, float]:
    """(mean KL(reference || engine) in nats, greedy agreement) of the next-token distribution at
    every position of the reference's answers (teacher forcing: both models read the same text,
    so each position compares like with like)."""
    kls, agree = [], []
    for case in cases:
        ref, got = case.reference_logprobs, answer_logprobs(engine, case.ids, case.num_prompt_tokens)  # (N, V)
        kls.append((ref.exp() * (ref - got)).sum(-1))  # (N,)
        agree.append(ref.argmax(-1) == got.argmax(-1))
    return float(torch.cat(kls).mean()), float(torch.cat(agree).float().mean())


def default_precisions(device: str, has_gguf: bool) -> list[str]:
    if device.startswith("cuda"):
        return ["bfloat16", "int8"]
    return ["float32", "bfloat16", "int8", "int4"] + (["gguf"] if has_gguf else [])


# Loads the model as a user's worker does (`auto`), in a fresh process: its time and peak memory.
_LOAD_PROBE = """
import json, resource, sys, time
import torch, transformers  # noqa: F401 (what every worker imports before a load)
from inference.config import EngineConfig
from inference.models.loader import load_model
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
loaded = load_model(EngineConfig(source=sys.argv[1], dtype="auto", device=sys.argv[2]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"load_s": time.perf_counter() - start, "precision": loaded.precision,
                  "peak_rss_mb": peak / 1024, "base_rss_mb": base / 1024}))
"""


def measure_default_load(model: str, device: str) -> dict:
    """{load_s, precision, peak_rss_mb, base_rss_mb} of `auto`'s load in a process of its own."""
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_PROBE, model, device], capture_output=True, text=True, timeout=900
    )
    if result.returncode != 0:
        raise RuntimeError(f"loading {model} failed: {result.stderr.strip()[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main_precision(args: argparse.Namespace) -> dict:
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    gguf = gguf_source(EngineConfig(source=args.model))
    precisions = args.precision.split(",") if args.precision else default_precisions(device, gguf is not None)
    default = resolve_precision("auto", torch.device(device), gguf)
    load = measure_default_load(args.model, device)
    if getattr(args, "only", None) == "load":  # `auto`'s load in a fresh process alone: seconds, not minutes
        return {"default_precision": default, **load_results(load, gguf)}
    if default not in precisions:
        precisions.append(default)
    num_tokens, repeats = (32, 2) if args.quick else (128, 3)
    bandwidth = read_bandwidth(512 << 20 if device == "cpu" else 1 << 30, device=device)
    engines = {}
    for p in precisions:
        try:
            engines[p] = Engine.load(EngineConfig(source=args.model, dtype=p, device=device))
        except ModelLoadError as error:  # e.g. no int8 kernel for this GPU: the others still run
            print(f"{p}: skipped ({error})")
    reference = engines.get("float32") or Engine.load(EngineConfig(source=args.model, dtype="float32", device=device))
    first = next(iter(engines.values()))
    chat_ids = first.prompts.encode(PROMPT)
    long_ids = (first.prompts.encode("The lighthouse stood on the rocks above the harbour. ") * args.prompt_len)[
        : args.prompt_len
    ]
    llama = LlamaCppBench.open(gguf, torch.get_num_threads()) if device == "cpu" else None
    print(f"model={first.loaded.name}  device={device}  threads={torch.get_num_threads()}")
    print(f"read bandwidth {bandwidth / 1e9:.1f} GB/s")
    for p, engine in engines.items():
        if engine.loaded.quantization is not None:
            print(f"{p}: {_served_as(engine.loaded.quantization)}")
    print(f"decode: greedy, {num_tokens} tokens, top-20 distribution every step; prefill: {args.prompt_len} tokens")
    print(f"quality: {len(QUALITY_PROMPTS)} prompts x {args.quality_tokens} tokens teacher-forced vs float32")
    rows: dict[str, dict[str, list[float]]] = {p: {"decode": [], "prefill": []} for p in engines}
    cpp: dict[str, list[float]] = {"decode": [], "decode_top20": [], "prefill": []}
    for _ in range(repeats):  # interleaved, best of N: noise hits every side alike
        for p, engine in engines.items():
            rows[p]["decode"].append(time_ours_decode(engine, chat_ids, num_tokens))
            rows[p]["prefill"].append(time_ours_prefill(engine, long_ids))
        if llama is not None:
            cpp["decode"].append(llama.decode_tok_s(chat_ids, num_tokens, top_k=0))
            cpp["decode_top20"].append(llama.decode_tok_s(chat_ids, num_tokens, top_k=20))
            cpp["prefill"].append(llama.prefill_tok_s(long_ids))
    results = table(engines, reference, rows, bandwidth, quality_cases(reference, args.quality_tokens))
    results.update(default_results(results, default, load, gguf))
    if llama is not None:
        results.update(compare_llamacpp(results, cpp, default))
    return results


def default_results(results: dict, default: str, load: dict, gguf: Path | None) -> dict:
    """What a user gets (`auto`): its precision's figures, and its load in a fresh process."""
    out = {
        "default_precision": default,
        "decode_tok_s_default": results[f"decode_tok_s_{default}"],
        "prefill_tok_s_default": results[f"prefill_tok_s_{default}"],
        "kl_default": results[f"kl_{default}"],
    }
    return {**out, **load_results(load, gguf)}


def load_results(load: dict, gguf: Path | None) -> dict:
    """`auto`'s load in a fresh process: its time, peak RSS and (a GGUF model) that peak over the file's size."""
    out = {"load_s_default": load["load_s"], "load_peak_rss_mb_default": load["peak_rss_mb"]}
    if gguf is not None:
        file_mb = gguf.stat().st_size / 2**20
        out["load_rss_over_file_default"] = load["peak_rss_mb"] / file_mb
    print(
        f"default (auto) = {load['precision']}: loaded in {load['load_s']:.1f} s, "
        f"peak RSS {load['peak_rss_mb']:.0f} MB (torch and transformers alone: {load['base_rss_mb']:.0f} MB)"
    )
    return out


def table(engines: dict, reference: Engine, rows: dict, bandwidth: float, cases: list[QualityCase]) -> dict:
    print(
        f"{'precision':<9} {'decode tok/s':>12} {'prefill tok/s':>13} {'MB/token':>9} {'bw bound':>8} "
        f"{'of bound':>8} {'KL vs fp32':>10} {'greedy agree':>12}"
    )
    results: dict = {}
    for p, engine in engines.items():
        decode, prefill = max(rows[p]["decode"]), max(rows[p]["prefill"])
        read_bytes = decode_read_bytes(engine.model)
        bound = bandwidth / read_bytes
        kl, agreement = (0.0, 1.0) if engine is reference else quality(cases, engine)
        print(
            f"{p:<9} {decode:>12.1f} {prefill:>13.1f} {read_bytes / 1e6:>9.1f} {bound:>8.1f} "
            f"{decode / bound:>8.0%} {kl:>10.5f} {agreement:>12.1%}"
        )
        results.update({f"decode_tok_s_{p}": decode, f"prefill_tok_s_{p}": prefill, f"kl_{p}": kl})
        results.update({f"agreement_{p}": agreement, f"mb_per_token_{p}": read_bytes / 1e6})
        results[f"bandwidth_fraction_{p}"] = decode / bound
    best = max(engines, key=lambda p: results[f"decode_tok_s_{p}"])
    results.update(
        best_precision=best,
        decode_tok_s_best=results[f"decode_tok_s_{best}"],
        kl_best=results[f"kl_{best}"],
        prefill_tok_s_best=max(results[f"prefill_tok_s_{p}"] for p in engines),
    )
    return results


def _served_as(report) -> str:
    """ "12 Q4_K -> int4 (the file's blocks), 132 Q5_0 -> int8, ...": how each file type is served."""
    parts = []
    for g in report.groups:
        what = f"head {g.file_type}".strip() if g.is_head else f"{g.num_layers} {g.file_type or 'layers'}"
        exact = " (the file's blocks)" if g.is_exact else ""
        parts.append(f"{what} -> {g.served_as}{exact}")
    return ", ".join(parts)


def compare_llamacpp(results: dict, cpp: dict[str, list[float]], default: str) -> dict:
    decode, decode_top20, prefill = max(cpp["decode"]), max(cpp["decode_top20"]), max(cpp["prefill"])
    print(
        f"llama.cpp (same GGUF, same prompt ids): decode {decode:.1f} tok/s, with a top-20 distribution "
        f"{decode_top20:.1f} tok/s, prefill {prefill:.1f} tok/s"
    )
    out = {
        "llamacpp_decode_tok_s": decode,
        "llamacpp_decode_top20_tok_s": decode_top20,
        "llamacpp_prefill_tok_s": prefill,
        "decode_vs_llamacpp": results["decode_tok_s_best"] / decode,
        "decode_vs_llamacpp_top20": results["decode_tok_s_best"] / decode_top20,
        "prefill_vs_llamacpp": results["prefill_tok_s_best"] / prefill,
        "decode_vs_llamacpp_default": results[f"decode_tok_s_{default}"] / decode,
        "prefill_vs_llamacpp_default": results[f"prefill_tok_s_{default}"] / prefill,
    }
    print(
        f"ours ({results['best_precision']}, top-20 on) vs llama.cpp: decode {out['decode_vs_llamacpp']:.2f}x "
        f"(its top-20 off), {out['decode_vs_llamacpp_top20']:.2f}x (on); prefill {out['prefill_vs_llamacpp']:.2f}x"
    )
    print(
        f"default ({default}) vs llama.cpp: decode {out['decode_vs_llamacpp_default']:.2f}x (its top-20 off), "
        f"prefill {out['prefill_vs_llamacpp_default']:.2f}x"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench precision", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish within a few minutes")
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--model", default="bundled", help="a bundled model ('bundled:qwen2.5-coder-0.5b-instruct'), folder or .gguf"
    )
    parser.add_argument("--precision", default=None, help="comma-separated (default: all on this device)")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--quality-tokens", type=int, default=24)
    parser.add_argument(
        "--only", choices=("load",), default=None, help="load: only the default's load (time, peak RSS)"
    )
    print(format_keys(main_precision(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
