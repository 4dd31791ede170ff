"""Prefill/decode disaggregation benchmark: do long prefills stop stalling running decodes?

`python -m inference.bench pd [--quick]` (or `python -m inference.bench.pd`).

One mixed load, served two ways, side by side in one run: a few chats are decoding when
long-prompt requests (about 1,500 tokens each) arrive.

- colocated: one worker (this process, every core) serves everything in its continuous batch:
  a newcomer's prefill is chunked into the steps the chats decode in, so every chat's next
  token waits behind the chunk of its step.
- disaggregated: a prefill worker process (half of the cores, or the second GPU) prefills
  the newcomers, serializes the KV cache with `inference.kv.transfer` and leaves it in a
  local store (a file on tmpfs); the decode worker (this process, the other cores / first
  GPU) keeps decoding, and picks the blob up, verifies and loads it between two steps.

Reported: the chats' inter-token latency (p50/p99) and the newcomers' time to first token
(arrival -> first token; arrivals are tied to the chats' progress, not to wall time, so
both modes see the same load), plus the handoff's size and timings. The last line is
`key=value` pairs.

Both workers run on one machine, so "separate hardware" is two disjoint sets of CPU cores
(`sched_setaffinity`): on 2 cores each worker gets one. They still share memory bandwidth
and caches, and any other load on the machine; and one core decodes more slowly than two.
See docs/pd-disaggregation.md for what this shows and what two GPUs would show.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from inference.bench import format_keys, percentile
from inference.config import EngineConfig
from inference.engine import Engine
from inference.events import Event, Finished, Step
from inference.sampling_params import SamplingParams

QUESTIONS = (
    "Tell me about lighthouses.",
    "Why is the sea salty?",
    "Describe a storm at night.",
    "How do ships navigate?",
    "What do keepers eat?",
    "Write a poem about fog.",
)
FILLER = (
    "The keeper climbed the tower every night to light the lamp while storms rolled in from the "
    "grey sea and ships passed far away carrying letters, salt, timber and news. "
)


@dataclass(frozen=True)
class Workload:
    chat_ids: list[list[int]]
    long_ids: list[list[int]]
    chat_params: SamplingParams
    long_params: SamplingParams
    arrivals: list[int]  # long request i arrives once the chats produced this many tokens in all


@dataclass
class Stream:
    """One request being served: when each of its tokens came out."""

    is_chat: bool
    arrived_at: float = 0.0
    token_times: list[float] = field(default_factory=list)
    skip_first_step: bool = False  # handed over: the prefill worker produced the first token
    is_done: bool = False

    def take(self, event: Event) -> None:
        if isinstance(event, Finished):
            self.is_done = True
        elif isinstance(event, Step) and not (self.skip_first_step and event.index == 0):
            self.token_times.append(time.monotonic())


def step(engine: Engine, streams: dict[int, Stream]) -> None:
    """One engine step; each request's records go to its stream."""
    for request_id, event in engine.step():
        streams[request_id].take(event)


@dataclass
class Result:
    streams: list[Stream]
    handoffs: list[dict[str, float]] = field(default_factory=list)

    def itl_ms(self) -> list[float]:
        return [(b - a) * 1000 for s in self.streams if s.is_chat for a, b in zip(s.token_times, s.token_times[1:])]

    def ttft_ms(self) -> list[float]:
        return [(s.token_times[0] - s.arrived_at) * 1000 for s in self.streams if not s.is_chat]


# ---- the workload ---------------------------------------------------------------------------


def make_workload(
    engine: Engine, num_chats: int, chat_tokens: int, num_long: int, long_len: int, long_tokens: int
) -> Workload:
    def chat(text: str) -> list[int]:
        return engine.prompts.build(messages=[{"role": "user", "content": text}]).token_ids

    filler = engine.prompts.encode(FILLER)
    long_text = engine.loaded.tokenizer.decode((filler * (long_len // len(filler) + 1))[:long_len])
    long_ids = [chat(f"Request {i}. {long_text} Summarise this.") for i in range(num_long)]
    total = num_chats * chat_tokens
    # Spread the arrivals over the middle of the chats' run, so every prefill meets running decodes.
    arrivals = [int(total * (i + 1) / (num_long + 2)) for i in range(num_long)]
    params = SamplingParams(greedy=True, ignore_eos=True, num_alternatives=10, use_prefix_cache=False)
    return Workload(
        chat_ids=[chat(QUESTIONS[i % len(QUESTIONS)]) for i in range(num_chats)],
        long_ids=long_ids,
        chat_params=replace(params, max_new_tokens=chat_tokens),
        long_params=replace(params, max_new_tokens=long_tokens),
        arrivals=arrivals,
    )


def start_chats(engine: Engine, workload: Workload) -> dict[int, Stream]:
    """The chats, prefilled and past their first token: from here on they are decoding."""
    streams = {engine.add_request(ids, workload.chat_params): Stream(is_chat=True) for ids in workload.chat_ids}
    for stream in streams.values():
        stream.arrived_at = time.monotonic()
    while any(not s.token_times for s in streams.values()):
        step(engine, streams)
    return streams


def chat_tokens(streams: dict[int, Stream]) -> int:
    return sum(len(s.token_times) for s in streams.values() if s.is_chat)


# ---- colocated -------------------------------------------------------------------------------


def run_colocated(engine: Engine, workload: Workload) -> Result:
    streams, pending = start_chats(engine, workload), list(enumerate(workload.long_ids))
    while engine.has_unfinished or pending:
        while pending and chat_tokens(streams) >= workload.arrivals[pending[0][0]]:
            _, ids = pending.pop(0)
            streams[engine.add_request(ids, workload.long_params)] = Stream(is_chat=False, arrived_at=time.monotonic())
        step(engine, streams)
    return Result(list(streams.values()))


# ---- disaggregated -----------------------------------------------------------------------------


def _prefill_worker(config: EngineConfig, cores: set[int], store_dir: str, jobs: mp.Queue, results: mp.Queue) -> None:
    """The prefill worker process: prefill + first token, serialize, store, report."""
    pin(cores)
    engine = Engine.load(config)
    results.put(("ready", engine.model_info()["name"]))
    while (job := jobs.get()) is not None:
        job_id, prompt_ids, params = job
        t0 = time.perf_counter()
        handoff = engine.prefill_for_handoff(prompt_ids, params)
        first_token_at = time.monotonic()  # system-wide clock: comparable with the decode process
        prefill_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        blob = engine.export_handoff(handoff)
        serialize_ms = (time.perf_counter() - t0) * 1000
        t0 = time.perf_counter()
        path = Path(store_dir) / f"{job_id}.kv"
        path.write_bytes(blob)
        results.put(
            (
                "done",
                job_id,
                str(path),
                {
                    "first_token_at": first_token_at,
                    "prefill_ms": prefill_ms,
                    "serialize_ms": serialize_ms,
                    "store_ms": (time.perf_counter() - t0) * 1000,
                    "kv_bytes": len(blob),
                },
            )
        )


class PrefillWorker:
    def __init__(self, config: EngineConfig, cores: set[int]) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch (or CUDA) state
        self.store = tempfile.TemporaryDirectory(
            prefix="bench-pd-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None
        )
        self.jobs, self.results = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(
            target=_prefill_worker, args=(config, cores, self.store.name, self.jobs, self.results), daemon=True
        )
        self.process.start()
        kind, self.model_name = self.results.get(timeout=600)
        assert kind == "ready"

    def submit(self, job_id: int, prompt_ids: list[int], params: SamplingParams) -> None:
        self.jobs.put((job_id, prompt_ids, params))

    def poll(self, block: bool) -> list[tuple]:
        found = []
        try:
            found.append(self.results.get(timeout=600) if block else self.results.get_nowait())
            while True:
                found.append(self.results.get_nowait())
        except queue.Empty:
            return found

    def close(self) -> None:
        self.jobs.put(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        self.store.cleanup()


def run_disaggregated(engine: Engine, workload: Workload, worker: PrefillWorker) -> Result:
    streams, pending = start_chats(engine, workload), list(enumerate(workload.long_ids))
    waiting: dict[int, Stream] = {}
    result = Result([])
    while engine.has_unfinished or waiting or pending:
        while pending and chat_tokens(streams) >= workload.arrivals[pending[0][0]]:
            job_id, ids = pending.pop(0)
            waiting[job_id] = Stream(is_chat=False, arrived_at=time.monotonic(), skip_first_step=True)
            worker.submit(job_id, ids, workload.long_params)
        for _, job_id, path, timings in worker.poll(block=not engine.has_unfinished):
            request_id = _load(engine, waiting[job_id], Path(path), timings, result)
            streams[request_id] = waiting.pop(job_id)
        step(engine, streams)
    result.streams = list(streams.values())
    return result


def _load(engine: Engine, stream: Stream, path: Path, timings: dict[str, float], result: Result) -> int:
    """Fetch and verify a handed-over request between two decode steps; it joins the batch."""
    t0 = time.perf_counter()
    blob = path.read_bytes()
    path.unlink()
    fetch_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    handoff = engine.import_handoff(blob)
    request_id = engine.add_request(handoff.prompt_ids, handoff.params, handoff=handoff)
    stream.token_times.append(timings["first_token_at"])
    result.handoffs.append({**timings, "fetch_ms": fetch_ms, "load_ms": (time.perf_counter() - t0) * 1000})
    return request_id


# ---- reporting ---------------------------------------------------------------------------------


def pin(cores: set[int]) -> None:
    """Run this process (and the threads it starts from now on) on `cores` only; torch uses them all."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(max(len(cores), 1))


def split_cores() -> tuple[set[int], set[int], set[int]]:
    """All cores (colocated), the decode worker's half and the prefill worker's half."""
    if not hasattr(os, "sched_getaffinity"):
        return set(), set(), set()  # cannot pin here: the workers share whatever the OS gives them
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return set(cores), set(cores), set(cores)
    half = len(cores) // 2
    return set(cores), set(cores[:half]), set(cores[half:])


def prefill_device(device: str) -> str:
    """The second GPU when there is one; else the decode worker's device."""
    if device in ("auto", "cuda") and torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        return "cuda:1"
    return device


def summarize(name: str, result: Result) -> dict[str, float]:
    itl, ttft = result.itl_ms(), result.ttft_ms()
    row = {
        f"itl_p50_{name}_ms": percentile(itl, 50),
        f"itl_p99_{name}_ms": percentile(itl, 99),
        f"itl_max_{name}_ms": max(itl),
    }
    if ttft:
        row[f"ttft_p50_{name}_ms"] = percentile(ttft, 50)
    print(f"{name:<13} " + " ".join(f"{v:>8.1f}" for v in row.values()) + f"   ({len(itl)} gaps, {len(ttft)} prefills)")
    return row


def handoff_summary(result: Result) -> dict[str, float]:
    mean = {
        key: statistics.fmean(h[key] for h in result.handoffs)
        for key in ("prefill_ms", "serialize_ms", "store_ms", "fetch_ms", "load_ms", "kv_bytes")
    }
    print(
        f"handoff (mean of {len(result.handoffs)}): {mean['kv_bytes'] / 1e6:.1f} MB, prefill "
        f"{mean['prefill_ms']:.0f} ms, serialize {mean['serialize_ms']:.0f} ms, store {mean['store_ms']:.0f} ms, "
        f"fetch {mean['fetch_ms']:.0f} ms, verify+load {mean['load_ms']:.0f} ms"
    )
    return {
        "kv_transfer_mb": mean["kv_bytes"] / 1e6,
        "serialize_ms": mean["serialize_ms"],
        "transfer_ms": mean["store_ms"] + mean["fetch_ms"],
        "load_ms": mean["load_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench pd", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="finish within about a minute")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--prompt-len", type=int, default=1500, help="tokens in each long prompt")
    args = parser.parse_args(argv)
    num_chats, chat_tokens, num_long = (3, 32, 2) if args.quick else (4, 96, 4)
    all_cores, decode_cores, prefill_cores = split_cores()
    config = EngineConfig(device=args.device)
    engine = Engine.load(config)
    workload = make_workload(engine, num_chats, chat_tokens, num_long, args.prompt_len, long_tokens=8)
    worker = PrefillWorker(EngineConfig(device=prefill_device(args.device)), prefill_cores)
    try:
        print(
            f"{num_chats} chats decoding {chat_tokens} tokens each; {num_long} requests with "
            f"{len(workload.long_ids[0])}-token prompts arrive meanwhile. device={engine.device}; colocated: "
            f"{len(all_cores)} cores; disaggregated: decode {len(decode_cores)} + prefill {len(prefill_cores)} cores"
        )
        print(f"{'mode':<13} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8} {'TTFT p50':>8}   (ms)")
        pin(all_cores)
        results = summarize("colocated", run_colocated(engine, workload))
        pin(decode_cores)
        disaggregated = run_disaggregated(engine, workload, worker)
        results.update(summarize("disagg", disaggregated))
        # The same chats on the decode worker's cores with no prefill traffic at all: what the
        # prefill worker's compute (shared memory bandwidth and caches) costs the decodes.
        results.update(summarize("decode_alone", run_colocated(engine, replace(workload, long_ids=[], arrivals=[]))))
        results.update(handoff_summary(disaggregated))
    finally:
        worker.close()
    print(format_keys(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
