"""Fair sharing through the real stack: another user's time to first token while one user loads
the worker: `python -m inference.bench fairness [--quick] [--model M] [--dtype D] [--url URL]`.

Owns: issue 21's bound, measured the way a class meets it. User A (one browser session) starts a
load, then user B (another session) asks short questions one after another, `--samples` of them
(greedy, 32 new tokens, top-20 alternatives as the chat page asks), each timed from its send to
its first token. Loads: "none" (B alone: the baseline), "long_prompts" (A's two longest prompts
the site accepts at once, `PLAYGROUND_MAX_PROMPT_CHARS` each, both of A's slots) and "no_kv" (A's
2,000-token prompt answered with `use_kv_cache: false`: every step recomputes the whole prefix).
B's samples are taken only while A's load still runs; A's generations are stopped when B is done.
The last line is `key=value`: `b_ttft_p95_ms_<load>`, `b_engine_ttft_p95_ms_<load>` (the part
from the request's arrival in the engine: the rest is the stack's), `num_samples_<load>` and
`bound_met` (1 when every loaded p95 is under `--bound-ms`, 2 s by default).

The stack is `scripts/run.py` on a throw-away DB (`stack.started_stack`), or `--url` a running one.
Must not know: the stack's internals (driven over its wire protocol only, like `bench.stack`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from inference.bench import format_keys, percentile
from inference.bench.batch import QUESTIONS
from inference.bench.stack import Browser, free_port, stack_model_id, started_stack
from inference.bundled_models import QWEN_CODER

B_TOKENS = 32
NUM_ALTERNATIVES = 20
LONG_PROMPT_CHARS = 32_000  # the site's PLAYGROUND_MAX_PROMPT_CHARS default: the longest turn it takes
NO_KV_PROMPT_WORDS = 1_600  # about 2,000 tokens of the filler below
FILLER = "The quick brown fox jumps over the lazy dog while the river runs past the old mill. "
LOAD_START_WAIT_S = 120.0
RECV_TIMEOUT_S = 600.0


@dataclass
class Load:
    """User A's side: its generations, started on one socket, followed until they end or stop."""

    generation_ids: list[int] = field(default_factory=list)
    is_running: threading.Event = field(default_factory=threading.Event)
    is_over: threading.Event = field(default_factory=threading.Event)
    outcomes: list[str] = field(default_factory=list)


def load_commands(load: str, model_id: int) -> list[dict]:
    """A's `generate` commands for `load` (prompts differ so no prefix is shared between them)."""
    if load == "long_prompts":
        texts = [f"Text {i}. " + FILLER * (LONG_PROMPT_CHARS // len(FILLER)) for i in range(2)]
        texts = [t[: LONG_PROMPT_CHARS - 40] + " Summarize it." for t in texts]
        overrides = {"max_new_tokens": 64, "greedy": True, "ignore_eos": True, "use_prefix_cache": False}
    elif load == "no_kv":
        texts = [" ".join(FILLER.split()[i % 16] for i in range(NO_KV_PROMPT_WORDS)) + " Summarize it."]
        overrides = {"max_new_tokens": 48, "greedy": True, "ignore_eos": True, "use_kv_cache": False}
    else:
        return []
    return [{"command": "generate", "content": t, "model_id": model_id, "overrides": overrides} for t in texts]


def run_load(base_url: str, commands: list[dict], state: Load, stop: threading.Event) -> None:
    """A's socket: send `commands`, mark the load running once the worker has taken each, follow
    them until they end, and stop them when `stop` is set."""
    browser = Browser(base_url)
    try:
        with browser.connect(browser.load_page()) as ws:
            for command in commands:
                ws.send(json.dumps(command))
            num_ended, stopped = 0, False
            while num_ended < len(commands):
                if stop.is_set() and not stopped:
                    for generation_id in state.generation_ids:
                        ws.send(json.dumps({"command": "stop", "generation_id": generation_id}))
                    stopped = True
                with contextlib.suppress(TimeoutError):
                    event = json.loads(ws.recv(timeout=0.5))
                    kind = event.get("type")
                    if kind == "generation.queued":
                        state.generation_ids.append(event["generation_id"])
                    elif kind == "generation.started" and len(state.generation_ids) == len(commands):
                        state.is_running.set()
                    elif kind in ("generation.finished", "generation.error", "error"):
                        num_ended += 1
                        state.outcomes.append(f"{kind} {event.get('code') or event.get('finish_reason')}")
    finally:
        state.is_over.set()
        state.is_running.set()  # never leave B waiting for a load that died


def time_to_first_token(ws, model_id: int, question: str) -> tuple[float | None, dict]:
    """B sends one question: the seconds to its first token (None when it got none) and the
    worker's own stats of it (`ttft_ms` from the engine's arrival, `queue_ms` before its first step)."""
    overrides = {
        "max_new_tokens": B_TOKENS,
        "greedy": True,
        "ignore_eos": True,
        "num_alternatives": NUM_ALTERNATIVES,
        "use_prefix_cache": False,
    }
    sent = time.perf_counter()
    ws.send(json.dumps({"command": "generate", "content": question, "model_id": model_id, "overrides": overrides}))
    first = None
    while True:
        event = json.loads(ws.recv(timeout=RECV_TIMEOUT_S))
        kind = event.get("type")
        if kind == "generation.tokens" and first is None:
            first = time.perf_counter() - sent
        elif kind in ("generation.finished", "generation.error", "error"):
            if kind != "generation.finished":
                raise RuntimeError(f"B's question failed: {event.get('code')}: {event.get('message')}")
            return first, event.get("stats") or {}


def measure(base_url: str, model_id: int, load: str, num_samples: int) -> tuple[list[float], list[float]]:
    """B's TTFTs (seconds) taken while A's `load` runs (all of them for "none"), and the engine's
    share of each (seconds from the request's arrival in the engine to its first token): the
    rest is the stack's (web, task, prompt build, publishing)."""
    state, stop = Load(), threading.Event()
    commands = load_commands(load, model_id)
    loader = threading.Thread(target=run_load, args=(base_url, commands, state, stop), daemon=True)
    if commands:
        loader.start()
        if not state.is_running.wait(LOAD_START_WAIT_S) or state.is_over.is_set():
            raise RuntimeError(f"A's {load} load did not start: {state.outcomes}")
        time.sleep(1.0)  # A is under way (prefilling) when B asks
    ttfts: list[float] = []
    engine_ttfts: list[float] = []
    browser = Browser(base_url)
    try:
        with browser.connect(browser.load_page()) as ws:
            for i in range(num_samples):
                ttft, stats = time_to_first_token(ws, model_id, QUESTIONS[i % len(QUESTIONS)])
                if commands and state.is_over.is_set():
                    break  # A's load ended before this answer: not a loaded sample
                if ttft is not None:
                    ttfts.append(ttft)
                    engine_ttfts.append((stats.get("ttft_ms") or 0.0) / 1000)
    finally:
        stop.set()
        if commands:
            loader.join(RECV_TIMEOUT_S)
    print(f"{load:>13}: B's TTFT s {[round(t, 2) for t in ttfts]}; A: {state.outcomes or '-'}", flush=True)
    print(f"{'':>13}  of which in the engine s {[round(t, 2) for t in engine_ttfts]}", flush=True)
    return ttfts, engine_ttfts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m inference.bench fairness", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 samples per load instead of 10")
    parser.add_argument("--samples", type=int, default=None, help="B's questions per load")
    parser.add_argument("--model", default=QWEN_CODER.source, help="the model B and A ask (default: make run's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--loads", default="none,long_prompts,no_kv", help="comma-separated, from the default")
    parser.add_argument("--bound-ms", type=float, default=2000.0, help="the TTFT p95 a loaded B must stay under")
    parser.add_argument("--url", default=None, help="a running stack (http://127.0.0.1:port) instead of starting one")
    args = parser.parse_args(argv)
    args.num_samples = args.samples or (3 if args.quick else 10)
    args.load_names = args.loads.split(",")
    unknown = set(args.load_names) - {"none", "long_prompts", "no_kv"}
    if unknown or args.num_samples < 1:
        parser.error(f"--loads {sorted(unknown)} unknown (none, long_prompts, no_kv); --samples >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fairness-bench-") as tmp, contextlib.ExitStack() as services:
        base_url = (
            args.url
            or services.enter_context(
                started_stack(free_port(), free_port(), args.dtype, args.device, Path(tmp))
            ).base_url
        )
        model_id = stack_model_id(base_url, args.model)
        measure(base_url, model_id, "none", 1)  # the worker loads its model on the first request
        print(f"model {args.model} ({args.dtype}) at {base_url}; B: {B_TOKENS} greedy tokens, top-{NUM_ALTERNATIVES}")
        keys: dict[str, float] = {}
        for load in args.load_names:
            ttfts, engine_ttfts = measure(base_url, model_id, load, args.num_samples)
            keys[f"num_samples_{load}"] = len(ttfts)
            for key, samples in ((f"b_ttft_p95_ms_{load}", ttfts), (f"b_engine_ttft_p95_ms_{load}", engine_ttfts)):
                keys[key] = percentile([t * 1000 for t in samples], 95) if samples else float("nan")
    loaded = [v for k, v in keys.items() if k.startswith("b_ttft_p95_ms_") and not k.endswith("_none")]
    keys["bound_met"] = int(bool(loaded) and all(v < args.bound_ms for v in loaded))
    print(format_keys(keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
