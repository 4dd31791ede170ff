"""Benchmarks, printed side by side in one run: `python -m inference.bench [mode] [--quick]`.

Modes: `precision` (default: every weight precision's decode and prefill speed, bytes read per
token and quality against float32, and llama.cpp on the same GGUF when installed), `decode`
(our prefill/decode vs `model.generate`, and decode speed as a fraction of the memory-bandwidth
bound), `batch` (continuous batching: N streams at once vs one by one), `stack` (the real
serving stack's WebSocket clients against the engine alone on the same requests), `fairness`
(another user's time to first token through the stack while one user loads the worker), `prefix` (prefix-cache
time to first token), `pd` (colocated vs disaggregated prefill/decode), `determinism` (the same
request cold, warm, batched and chunked: identical tokens and logprobs, and what that costs),
`quality` (every bundled model x precision x preset answering English and Chinese questions,
judged, with its speed), `structured` (a JSON Schema's cost per token, compile time and valid
rate on the default model), `fuzz` (a differential fuzz of the served path: random mixes of
requests and inspections on one engine, each compared bitwise with itself alone and cold),
`speculative` (prompt lookup and predictions: the same answers, and the time they save).
The last line printed is `key=value` pairs.
Ratios, not absolute numbers, are the point: both sides run in the same process,
interleaved, best of N, so machine noise hits both.
"""

from __future__ import annotations

import os
import statistics

_STARTING_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")  # before __main__ sets it for this process

MODES = (
    "precision",
    "decode",
    "batch",
    "stack",
    "fairness",
    "prefix",
    "pd",
    "determinism",
    "quality",
    "overload",
    "structured",
    "fuzz",
    "speculative",
)


def starting_env() -> dict[str, str]:
    """This process's environment with the OpenMP setting it started with, for the processes it
    starts (`__main__.quiet_openmp_workers` is for this process's engine only)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if _STARTING_OMP_WAIT_POLICY is not None:
        env["OMP_WAIT_POLICY"] = _STARTING_OMP_WAIT_POLICY
    return env


def format_keys(results: dict) -> str:
    """The last line of every benchmark: `key=value` pairs, floats to 4 significant digits."""
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in results.items())


def parse_keys(line: str) -> dict[str, float | str]:
    """The inverse of `format_keys`: a benchmark's last line as a dict (numbers as floats)."""
    results: dict[str, float | str] = {}
    for pair in line.split():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{pair!r} is not key=value")
        try:
            results[key] = float(value)
        except ValueError:
            results[key] = value
    return results


def percentile(values: list[float], q: int) -> float:
    """The q-th percentile (inclusive method); 0.0 for no values."""
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]
