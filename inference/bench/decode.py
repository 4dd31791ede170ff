"""Decode and prefill speed, ours vs `model.generate`: `python -m inference.bench decode [--quick]`.

Also decode speed as a fraction of the memory-bandwidth bound. Both sides run in the same
process, interleaved, best of N, so machine noise hits both.
"""

from __future__ import annotations

import argparse
import time

import torch

from inference.bench import format_keys
from inference.config import EngineConfig
from inference.engine import Engine
from inference.introspect.device_limits import read_bandwidth
from inference.sampling_params import SamplingParams

PROMPT = "<|im_start|>user\nWrite a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"


def time_ours_decode(engine: Engine, prompt_ids: list[int], num_tokens: int) -> float:
    """Decode tokens/s (excluding the prefill step), greedy, top-20 alternatives reported."""
    params = SamplingParams(
        greedy=True, max_new_tokens=num_tokens, ignore_eos=True, num_alternatives=20, use_prefix_cache=False
    )
    finished = list(engine.generate(prompt_ids, params))[-1]
    return finished.decode_tok_s


def time_hf_decode(model, prompt_ids: list[int], num_tokens: int) -> float:
    """`model.generate` decode tokens/s: (time for N tokens - time for 1 token) / (N - 1)."""
    ids = torch.tensor([prompt_ids], device=model.device)

    def timed(n: int) -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                temperature=None,
                top_p=None,
                top_k=None,
            )
        return time.perf_counter() - t0

    return (num_tokens - 1) / (timed(num_tokens) - timed(1))


def time_ours_prefill(engine: Engine, prompt_ids: list[int]) -> float:
    params = SamplingParams(greedy=True, max_new_tokens=1, num_alternatives=20, use_prefix_cache=False)
    prefilled = next(iter(engine.generate(prompt_ids, params)))
    return len(prompt_ids) / (prefilled.prefill_ms / 1000)


def time_hf_prefill(model, prompt_ids: list[int]) -> float:
    ids = torch.tensor([prompt_ids], device=model.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=1,
            do_sample=False,
            pad_token_id=0,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return len(prompt_ids) / (time.perf_counter() - t0)


def bench_decode(
    dtype: str, device: str, num_tokens: int, prompt_len: int, repeats: int, bandwidth: float
) -> dict[str, float]:
    engine = Engine.load(EngineConfig(dtype=dtype, device=device))
    model = engine.model
    chat_ids = engine.prompts.encode(PROMPT)
    sentence = engine.prompts.encode("The lighthouse stood on the rocks above the harbour. ")
    long_ids = (sentence * prompt_len)[:prompt_len]
    rows = {"decode": ([], []), "prefill": ([], [])}
    for _ in range(repeats):  # interleaved, best of N: noise hits both sides alike
        rows["decode"][0].append(time_ours_decode(engine, chat_ids, num_tokens))
        rows["decode"][1].append(time_hf_decode(model, chat_ids, num_tokens))
        rows["prefill"][0].append(time_ours_prefill(engine, long_ids))
        rows["prefill"][1].append(time_hf_prefill(model, long_ids))
    info = engine.model_info()
    ours, hf = max(rows["decode"][0]), max(rows["decode"][1])
    bound = bandwidth / info["weight_bytes"]
    return {
        "decode_tok_s": ours,
        "hf_decode_tok_s": hf,
        "decode_speedup": ours / hf,
        "prefill_tok_s": max(rows["prefill"][0]),
        "hf_prefill_tok_s": max(rows["prefill"][1]),
        "prefill_speedup": max(rows["prefill"][0]) / max(rows["prefill"][1]),
        "bandwidth_bound_tok_s": bound,
        "bandwidth_fraction": ours / bound,
        "hf_bandwidth_fraction": hf / bound,
        "weight_mb": info["weight_bytes"] / 1e6,
    }


def main_decode(args: argparse.Namespace) -> dict[str, float]:
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    device = "cpu" if device == "auto" else device
    dtypes = (
        args.dtype.split(",")
        if args.dtype
        else (["bfloat16"] if device.startswith("cuda") else ["float32", "bfloat16"])
    )
    num_tokens, repeats = (24, 2) if args.quick else (64, 3)
    # the same reduction the roofline view times (inference/introspect/device_limits.py), over a bigger buffer
    bandwidth = read_bandwidth(512 << 20 if device == "cpu" else 1 << 30, device=device)
    print(f"device={device}  threads={torch.get_num_threads()}  measured read bandwidth {bandwidth / 1e9:.1f} GB/s")
    print(f"decode: greedy, {num_tokens} tokens, ours with top-20 alternatives (raw + processed) every step")
    print(f"prefill: one {args.prompt_len}-token prompt; best of {repeats}, interleaved")
    header = (
        f"{'dtype':<9} {'ours tok/s':>10} {'generate':>9} {'ratio':>6} | {'prefill ours':>12} {'generate':>9} "
        f"{'ratio':>6} | {'bw bound':>8} {'ours':>5} {'gen':>5}"
    )
    print(header)
    results: dict[str, float] = {}
    for i, dtype in enumerate(dtypes):
        r = bench_decode(dtype, device, num_tokens, args.prompt_len, repeats, bandwidth)
        print(
            f"{dtype:<9} {r['decode_tok_s']:>10.1f} {r['hf_decode_tok_s']:>9.1f} {r['decode_speedup']:>5.2f}x | "
            f"{r['prefill_tok_s']:>12.1f} {r['hf_prefill_tok_s']:>9.1f} {r['prefill_speedup']:>5.2f}x | "
            f"{r['bandwidth_bound_tok_s']:>8.1f} {r['bandwidth_fraction']:>5.0%} {r['hf_bandwidth_fraction']:>5.0%}"
        )
        suffix = "" if i == 0 else "_" + {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[dtype]
        results.update({k + suffix: v for k, v in r.items()})
    results["dtype"] = dtypes[0]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench decode", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish within about a minute")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None, help="comma-separated dtypes (default: float32,bfloat16 on CPU)")
    parser.add_argument("--prompt-len", type=int, default=512)
    print(format_keys(main_decode(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
