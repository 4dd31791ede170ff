"""Serving-stack benchmark: what the real stack delivers of what the engine makes.

`python -m inference.bench stack [--quick] [--model bundled|bundled:...] [--dtype D] [--url http://host:port]
[--llama-server PATH] [--repeats R]`

Owns: the side by side, in one run, on the same prompts (`batch.prompts`: one chat question each,
rendered with the model's template), model and precision, greedy, a fixed number of new tokens
each and top-20 alternatives every step: for N = 1, 8, 16 (`--quick`: 1, 8 and fewer tokens)
the engine alone in this process (`batch.run_batched`), then N WebSocket clients at once against
the stack, each a browser of its own (a page load for its session cookie and page token, then
`/ws/generate/?page_token=`, docs/protocol.md) sending one `generate`, then N OpenAI-API clients
streaming `/v1/chat/completions` (keyless from localhost, `logprobs` with the top 20, the
"Greedy" preset); and, with `--llama-server`,
N HTTP streaming clients against that binary on the model's GGUF (16 slots, continuous
batching). Each side: aggregate tokens/s (all tokens over first send to last token) and time to
first token p50/p95 from the send. The last line is `key=value` pairs (`report_keys`):
`stack_efficiency_N` is the stack's aggregate over the engine's (`v1_efficiency_N` through `/v1`).
Each side's CPU per token is measured too (a row of its own under each N): the engine alone's
(this process), the clients' (this process's threads) and, for a stack or llama-server this run
starts, that of its processes by role (`/proc`: the worker, daphne, Redis). What the stack and its
clients spend per token on this machine's cores bounds what it can deliver (`cpu_bound`): where
the engine alone already keeps every core busy, `stack_cpu_bound_N` is the most
`stack_efficiency_N` can read here, whatever the stack's scheduling.
Each N runs `--repeats` rounds (default 3, `--quick` 1), the sides interleaved in each round;
every figure is the median of its rounds (`median_of`).

The stack is the one `make run` starts (`scripts/run.py`: Redis, one Celery worker, daphne) on a
throw-away SQLite DB, with `PLAYGROUND_DTYPE`/`PLAYGROUND_DEVICE` set to `--dtype`/`--device`,
and stopped at the end; `--url` measures a running one instead (its worker's precision is its own:
pass the same `--dtype`). Must not know: the stack's internals (it is driven as subprocesses and
over its wire protocol only, so `inference/` imports none of django, celery or channels).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.cookiejar
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from inference.bench import format_keys, percentile, starting_env
from inference.bench.batch import QUESTIONS, load, prompts, run_batched, summarize
from inference.bundled_models import bundled_model
from inference.config import EngineConfig
from inference.engine import Engine
from inference.kernels.cpu import cpu_flags
from inference.models.loader import gguf_source
from inference.sampling_params import SamplingParams

REPO_DIR = Path(__file__).resolve().parents[2]
STACK_READY_TIMEOUT_S = 300.0
GENERATION_TIMEOUT_S = 900.0  # 16 clients of the larger model on a busy 2-core machine
NUM_ALTERNATIVES = 20  # as the chat page asks for
LLAMA_SERVER_SLOTS = 16
PAGE_TOKEN = re.compile(r'<meta name="page-token" content="([0-9a-f]+)">')
# What each of a started stack's processes is, by a word of its command line (scripts/run.py
# starts Redis, the Celery worker and daphne; the supervisor itself counts as "other").
ROLES = (("worker", "celery"), ("web", "daphne"), ("redis", "redis-server"), ("llama_server", "llama-server"))
# The engine's threads, by the names the OS has for them: the worker's loop thread
# (`serve_loop.ENGINE_THREAD_NAME`) and the CPU kernels' helpers (kernels/threads.c).
ENGINE_THREADS = ("engine-loop", "pg-kernels")


@dataclass
class ClientRun:
    """One client's request: when it was sent, when each of its tokens arrived, how it ended."""

    sent: float = 0.0
    token_times: list[float] = field(default_factory=list)
    ended: float = 0.0
    outcome: str = "not run"  # "generation.finished" when it got its whole answer


def summarize_clients(runs: list[ClientRun]) -> dict[str, float]:
    """The N clients as one measurement, the way `batch.summarize` reads the engine's streams."""
    answered = [r for r in runs if r.token_times]
    if not answered:
        raise RuntimeError(f"no client got a token: {sorted({r.outcome for r in runs})}")
    started = min(r.sent for r in runs)
    summary = summarize([r.token_times for r in answered], started, max(r.token_times[-1] for r in answered))
    summary["num_finished"] = float(sum(r.outcome == "generation.finished" for r in runs))
    # TTFT from each client's own send (they send within a few ms of each other)
    ttft_ms = [(r.token_times[0] - r.sent) * 1000 for r in answered]
    summary["ttft_p50"], summary["ttft_p95"] = percentile(ttft_ms, 50), percentile(ttft_ms, 95)
    return summary


def median_of(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Several rounds of one side as one: each figure's median; `num_finished` the worst round's."""
    merged = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    if "num_finished" in merged:
        merged["num_finished"] = min(r["num_finished"] for r in rounds)
    return merged


def report_keys(
    engine: dict[int, dict[str, float]],
    stack: dict[int, dict[str, float]],
    llama: dict[int, dict[str, float]],
    v1: dict[int, dict[str, float]] | None = None,
    num_cores: int = 1,
) -> dict[str, float]:
    """The last line's pairs for every N the stack ran (and the engine, `/v1` and llama-server
    with it); the CPU ones where it was measured (`measured_clients`, `measured_engine`)."""
    results: dict[str, float] = {}
    for n in sorted(stack):
        results[f"stack_tok_s_{n}"] = stack[n]["tok_s"]
        results[f"engine_tok_s_{n}"] = engine[n]["tok_s"]
        results[f"stack_efficiency_{n}"] = stack[n]["tok_s"] / engine[n]["tok_s"]
        results[f"stack_ttft_p50_ms_{n}"] = stack[n]["ttft_p50"]
        results[f"stack_ttft_p95_ms_{n}"] = stack[n]["ttft_p95"]
        results[f"engine_ttft_p95_ms_{n}"] = engine[n]["ttft_p95"]
        if "cpu_ms_engine" in engine[n]:
            results[f"engine_cpu_ms_per_token_{n}"] = engine[n]["cpu_ms_engine"]
        if (cpu_ms := stack_cpu_ms(stack[n])) is not None:
            results[f"stack_cpu_ms_per_token_{n}"] = cpu_ms
            results[f"client_cpu_ms_per_token_{n}"] = stack[n]["cpu_ms_clients"]
            results[f"stack_cpu_bound_{n}"] = cpu_bound(engine[n], stack[n], num_cores)
        if v1 and n in v1:
            results[f"v1_tok_s_{n}"] = v1[n]["tok_s"]
            results[f"v1_efficiency_{n}"] = v1[n]["tok_s"] / engine[n]["tok_s"]
            results[f"v1_ttft_p95_ms_{n}"] = v1[n]["ttft_p95"]
            if (bound := cpu_bound(engine[n], v1[n], num_cores)) is not None:
                results[f"v1_cpu_bound_{n}"] = bound
        if n in llama:
            results[f"llama_server_tok_s_{n}"] = llama[n]["tok_s"]
            results[f"vs_llama_server_{n}"] = stack[n]["tok_s"] / llama[n]["tok_s"]
    return results


def run_clients(
    n: int, one_client: Callable[[int, threading.Barrier, ClientRun], None], on_start: Callable[[], None] | None = None
) -> list[ClientRun]:
    """N threads; each prepares (connects), waits for the others, then sends its request
    (`on_start` runs once, when all are ready and before any sends)."""
    runs = [ClientRun() for _ in range(n)]
    barrier = threading.Barrier(n, action=on_start)

    def guarded(index: int) -> None:
        try:
            one_client(index, barrier, runs[index])
        except Exception as error:  # reported in the client's outcome
            barrier.abort()  # the others must not wait for a client that died preparing
            runs[index].outcome = f"{type(error).__name__}: {error}"

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GENERATION_TIMEOUT_S + 60)
    return runs


# ---- CPU: what each side spends per token, and the bound that puts on the stack -------------


def process_tree_cpu_s(root_pid: int) -> dict[str, float]:
    """CPU seconds so far (user + system) of `root_pid` and every process under it, summed by
    role: each process's by `ROLES` (a word of its command line; anything else is "other"), less
    the threads the OS knows by `ENGINE_THREADS`, which count as "engine". Linux's /proc;
    elsewhere, or for a process that is gone, {}."""
    processes: dict[int, tuple[int, float]] = {}  # pid: (parent pid, CPU seconds), of every process
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (stat := read_stat(entry)) is not None:
                processes[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    by_role: dict[str, float] = {}
    todo = [root_pid] if root_pid in processes else []
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:  # only the tree's command lines are read
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # it exited meanwhile
        engine_cpu_s = engine_threads_cpu_s(pid)
        role = next((role for role, word in ROLES if word in command), "other")
        by_role[role] = by_role.get(role, 0.0) + processes[pid][1] - engine_cpu_s
        if engine_cpu_s:
            by_role["engine"] = by_role.get("engine", 0.0) + engine_cpu_s
    return by_role


def read_stat(path: Path) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) from a /proc process's or thread's stat; None when it is gone."""
    try:  # the command name is in parentheses and may hold spaces: split after it
        fields = (path / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def engine_threads_cpu_s(pid: int) -> float:
    """The CPU seconds of a process's threads named as the engine's (`ENGINE_THREADS`)."""
    total = 0.0
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                if (task / "comm").read_text().strip() in ENGINE_THREADS and (stat := read_stat(task)):
                    total += stat[1]
    return total


def measured_clients(
    n: int, one_client: Callable[[int, threading.Barrier, ClientRun], None], server_pid: int | None
) -> dict[str, float]:
    """One round of N clients (`summarize_clients`) with the CPU it cost per token, in ms, from
    the moment all are connected (their page loads are not part of it): this process's clients
    (`cpu_ms_clients`) and, for a server this run started, each role of its processes (`cpu_ms_<role>`)."""
    before: dict[str, float] = {}
    clients_started: list[float] = []

    def on_start() -> None:
        before.update(process_tree_cpu_s(server_pid) if server_pid else {})
        clients_started.append(time.process_time())

    runs = run_clients(n, one_client, on_start)
    clients_cpu_s = time.process_time() - clients_started[0] if clients_started else 0.0
    after = process_tree_cpu_s(server_pid) if server_pid else {}
    summary = summarize_clients(runs)  # raises when no client got a token
    num_tokens = sum(len(run.token_times) for run in runs)
    summary["cpu_ms_clients"] = clients_cpu_s * 1000 / num_tokens
    for role, cpu_s in after.items():
        summary[f"cpu_ms_{role}"] = (cpu_s - before.get(role, 0.0)) * 1000 / num_tokens
    return summary


def measured_engine(engine: Engine, prompt_ids: list[list[int]], params: SamplingParams) -> dict[str, float]:
    """The engine alone's round (`batch.run_batched`, in this process) with its CPU per token
    (`cpu_ms_engine`: every thread of this process, the kernels' helpers included)."""
    started = time.process_time()
    summary = run_batched(engine, prompt_ids, params)
    num_tokens = len(prompt_ids) * params.max_new_tokens  # ignore_eos: each prompt gets them all
    summary["cpu_ms_engine"] = (time.process_time() - started) * 1000 / num_tokens
    return summary


def stack_cpu_ms(side: dict[str, float]) -> float | None:
    """The stack's processes' CPU per token (every role), or None when it was not measured."""
    roles = [value for key, value in side.items() if key.startswith("cpu_ms_") and key != "cpu_ms_clients"]
    return sum(roles) if roles else None


def cpu_bound(engine: dict[str, float], side: dict[str, float], num_cores: int) -> float | None:
    """The most of the engine's aggregate that a side can deliver when its CPU is the limit:
    `num_cores` cores spending what it measured per token (its processes' and the clients', all
    on this machine) give at most num_cores / that tokens a second. Above 1: the CPU it spends
    does not bind it on these cores (the engine alone, or a GPU, is the limit)."""
    cpu_ms = stack_cpu_ms(side)
    if cpu_ms is None:
        return None
    return num_cores * 1000 / (cpu_ms + side["cpu_ms_clients"]) / engine["tok_s"]


# ---- the stack's side: browsers speaking the WebSocket protocol ------------------------------


class Browser:
    """One browser's session against the stack: a page load, then its generation socket."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def load_page(self) -> str:
        """GET / (the session cookie) and the page token it renders."""
        with self.opener.open(self.base_url + "/", timeout=60) as response:
            match = PAGE_TOKEN.search(response.read().decode("utf-8", errors="replace"))
        if match is None:
            raise RuntimeError(f"{self.base_url}/ rendered no page token")
        return match.group(1)

    def connect(self, page_token: str):  # -> websockets.sync.client.ClientConnection
        try:
            from websockets.sync.client import connect  # requirements-dev.txt
        except ImportError:
            raise SystemExit("the stack benchmark needs `websockets` (pip install -r requirements-dev.txt)") from None
        host = urlparse(self.base_url).netloc
        return connect(
            f"ws://{host}/ws/generate/?page_token={page_token}",
            origin=self.base_url,
            additional_headers={"Cookie": "; ".join(f"{c.name}={c.value}" for c in self.cookies)},
            open_timeout=60,
            max_size=None,
        )


def stack_client(base_url: str, model_id: int, questions: list[str], num_tokens: int) -> Callable:
    """Client i asks questions[i] as a new conversation, greedy, for `num_tokens` tokens."""
    overrides = {
        "max_new_tokens": num_tokens,
        "greedy": True,
        "repetition_penalty": 1.0,  # the engine's side samples plain greedy: not the default preset's penalty
        "ignore_eos": True,
        "num_alternatives": NUM_ALTERNATIVES,
        "use_prefix_cache": False,
    }

    def one_client(index: int, barrier: threading.Barrier, run: ClientRun) -> None:
        browser = Browser(base_url)
        with browser.connect(browser.load_page()) as ws:
            barrier.wait(timeout=120)
            run.sent = time.perf_counter()
            command = {"command": "generate", "content": questions[index], "model_id": model_id, "overrides": overrides}
            ws.send(json.dumps(command))
            deadline = run.sent + GENERATION_TIMEOUT_S
            while True:
                event = json.loads(ws.recv(timeout=max(1.0, deadline - time.perf_counter())))
                if event.get("type") == "generation.tokens":
                    now = time.perf_counter()  # each token of a coalesced message arrived with it
                    run.token_times.extend(now for _ in event["steps"])
                elif event.get("type") in ("generation.finished", "generation.error", "error"):
                    run.ended, run.outcome = time.perf_counter(), event["type"]
                    if event["type"] != "generation.finished":
                        run.outcome += f" {event.get('code') or event.get('error_code')}: {event.get('message')}"
                    return

    return one_client


def stack_model_id(base_url: str, source: str) -> int:
    """The stack's id for the model `source` names (a bundled one by its catalogue name)."""
    return stack_model(base_url, source)["id"]


def stack_model(base_url: str, source: str) -> dict:
    """The stack's record ({id, name, ...}) of the model `source` names: the id is what a
    browser's `generate` sends, the name what `/v1` calls the model."""
    bundled = bundled_model(source)
    name = bundled.name if bundled is not None else source
    with urllib.request.urlopen(base_url.rstrip("/") + "/api/models/", timeout=60) as response:
        models = json.loads(response.read())
    for model in models:  # the shipped rows say where they come from: "SmolLM2-135M-Instruct (bundled)"
        if model["name"] in (name, f"{name} (bundled)"):
            if model.get("unavailable"):
                raise SystemExit(f"the stack cannot serve {name}: {model['unavailable']}")
            return model
    raise SystemExit(f"the stack has no model named {name!r}; it has {[m['name'] for m in models]}")


def streamed_chunks(base_url: str, path: str, body: dict, barrier: threading.Barrier, run: ClientRun) -> Iterator[dict]:
    """POSTs `body` to `path` once every client is ready (`run.sent` is then), and yields the
    JSON of each server-sent `data:` line (not the closing `[DONE]`)."""
    address = urlparse(base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=GENERATION_TIMEOUT_S)
    try:
        barrier.wait(timeout=120)
        run.sent = time.perf_counter()
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}: {response.read()[:300]!r}")
        for line in response:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                yield json.loads(line[len(b"data: ") :])
    finally:
        connection.close()


# ---- the OpenAI API's side: streaming /v1/chat/completions -------------------------------------


def v1_client(base_url: str, model_name: str, questions: list[str], num_tokens: int) -> Callable:
    """Client i asks questions[i] through `/v1/chat/completions`, streamed, as an OpenAI client
    would (keyless from localhost), plain greedy with the top-20 logprobs every token; a chunk
    may carry several tokens (the worker coalesces steps): each counts when its chunk arrives."""

    def one_client(index: int, barrier: threading.Barrier, run: ClientRun) -> None:
        body = {
            "model": model_name,
            "messages": [{"role": "user", "content": questions[index]}],
            "max_tokens": num_tokens,
            "stream": True,
            "logprobs": True,
            "top_logprobs": NUM_ALTERNATIVES,
            "preset": "Greedy",
            "repetition_penalty": 1.0,
            "ignore_eos": True,
            "use_prefix_cache": False,  # every prompt prefilled whole, as on the engine's side
        }
        for chunk in streamed_chunks(base_url, "/v1/chat/completions", body, barrier, run):
            if "error" in chunk:
                run.outcome = f"error {chunk['error'].get('code')}: {chunk['error'].get('message')}"
                return
            for choice in chunk.get("choices", []):
                tokens = (choice.get("logprobs") or {}).get("content") or []
                now = time.perf_counter()
                run.token_times.extend(now for _ in tokens)
                if choice.get("finish_reason"):
                    run.ended, run.outcome = now, "generation.finished"
        if run.outcome != "generation.finished":
            run.outcome = "the stream ended without a finish_reason"

    return one_client


# ---- starting and stopping processes ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_http(
    url: str, process: subprocess.Popen, log_path: Path, timeout_s: float = STACK_READY_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{process.args[0]} exited ({process.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} did not answer 200 within {timeout_s:.0f} s; see {log_path}")


def stop_group(process: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the process group (the supervisor stops its children in order), then SIGKILL."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@dataclass(frozen=True)
class Server:
    """A server to measure: its base URL and, when this run started it, its process (the root of
    the processes whose CPU `process_tree_cpu_s` counts)."""

    base_url: str
    pid: int | None = None


@contextlib.contextmanager
def started_stack(port: int, redis_port: int, dtype: str, device: str, work_dir: Path) -> Iterator[Server]:
    """`scripts/run.py` on `port` with its own Redis and a fresh DB."""
    env = starting_env() | {  # the worker as `make run` starts it: OpenMP as the user set it
        "HOST": "127.0.0.1",
        "PORT": str(port),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "DATABASE_URL": f"sqlite:///{work_dir / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "playground.settings",
        "PLAYGROUND_DTYPE": dtype,
        "PLAYGROUND_DEVICE": device,
    }
    log_path = work_dir / "stack.log"
    migrate = [sys.executable, "-m", "django", "migrate", "--noinput"]
    subprocess.run(migrate, cwd=REPO_DIR, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(REPO_DIR / "scripts" / "run.py")],
            cwd=REPO_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_for_http(base_url + "/", process, log_path)
        yield Server(base_url, process.pid)
    finally:
        stop_group(process)


def llama_server_env() -> dict[str, str]:
    """llama-server's environment: this one's without OMP_WAIT_POLICY. llama.cpp's threads run on
    OpenMP and want to spin between its many small parallel regions; with PASSIVE (which a
    caller may set for torch) it served 40-42 tok/s to one client against 115 on its default."""
    return {key: value for key, value in starting_env().items() if key != "OMP_WAIT_POLICY"}


@contextlib.contextmanager
def started_llama_server(binary: str, gguf: Path, num_tokens: int, work_dir: Path) -> Iterator[Server]:
    """llama-server on the GGUF with 16 slots and continuous batching."""
    port = free_port()
    argv = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-np", str(LLAMA_SERVER_SLOTS)]
    argv += ["-c", str(LLAMA_SERVER_SLOTS * (256 + num_tokens)), "--cont-batching", "-t", str(os.cpu_count() or 1)]
    if "amx_tile" in cpu_flags().split():  # its AMX weight repacking crashed at warm-up on a Xeon (as in llamacpp.py)
        argv += ["--no-repack"]
    log_path = work_dir / "llama-server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=llama_server_env(),
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_for_http(base_url + "/health", process, log_path)
        yield Server(base_url, process.pid)
    finally:
        stop_group(process, grace_s=10.0)


# ---- llama-server's side: its HTTP streaming /completion --------------------------------------


def llama_server_client(base_url: str, prompt_ids: list[list[int]], num_tokens: int) -> Callable:
    """Each client posts its prompt's token ids (the same ones the engine gets), greedy, with the
    top-20 probabilities every token, and reads the server-sent events."""

    def one_client(index: int, barrier: threading.Barrier, run: ClientRun) -> None:
        body = {
            "prompt": prompt_ids[index],
            "n_predict": num_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "n_probs": NUM_ALTERNATIVES,
            "cache_prompt": False,
            "stream": True,
        }
        for chunk in streamed_chunks(base_url, "/completion", body, barrier, run):
            if chunk.get("stop"):
                run.ended, run.outcome = time.perf_counter(), "generation.finished"
                return
            run.token_times.append(time.perf_counter())
        run.outcome = "the stream ended without its last event"

    return one_client


# ---- the run ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m inference.bench stack", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 8 clients, 32 tokens each")
    parser.add_argument("--model", default="bundled", help="a bundled model ('bundled:qwen2.5-coder-0.5b-instruct')")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--clients", default=None, help="comma-separated client counts (default 1,8,16; quick 1,8)")
    parser.add_argument("--url", default=None, help="a running stack (http://host:port) instead of starting one")
    parser.add_argument("--port", type=int, default=None, help="the started stack's HTTP port (default: a free one)")
    parser.add_argument("--redis-port", type=int, default=None, help="the started stack's Redis (default: a free one)")
    parser.add_argument("--llama-server", default=None, metavar="PATH", help="also measure this llama-server binary")
    parser.add_argument("--gguf", default=None, help="the GGUF llama-server loads (default: the model's own)")
    parser.add_argument("--repeats", type=int, default=None, help="rounds per N, medians reported (default 3; quick 1)")
    args = parser.parse_args(argv)
    args.num_tokens = args.max_new_tokens or (32 if args.quick else 64)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    try:
        args.client_counts = tuple(int(c) for c in (args.clients or ("1,8" if args.quick else "1,8,16")).split(","))
    except ValueError:
        parser.error(f"--clients {args.clients!r}: comma-separated numbers, e.g. 1,8,16")
    if args.num_tokens < 2 or any(n < 1 or n > len(QUESTIONS) for n in args.client_counts):
        parser.error(f"--max-new-tokens >= 2 and 1 <= clients <= {len(QUESTIONS)} (got {args.client_counts})")
    if args.url is not None and urlparse(args.url).hostname not in ("127.0.0.1", "localhost"):
        parser.error(f"--url {args.url!r}: the load goes to this machine only (127.0.0.1 or localhost)")
    return args


def print_row(
    n: int, engine: dict[str, float], stack: dict[str, float], v1: dict[str, float], llama: dict[str, float] | None
) -> None:
    row = (
        f"{n:>7} {engine['tok_s']:>10.1f} {engine['ttft_p50']:>6.0f}/{engine['ttft_p95']:<6.0f}"
        f" {stack['tok_s']:>9.1f} {stack['ttft_p50']:>6.0f}/{stack['ttft_p95']:<6.0f}"
        f" {stack['tok_s'] / engine['tok_s']:>10.2f} {stack['num_finished']:>8.0f}"
        f" {v1['tok_s']:>9.1f} {v1['ttft_p50']:>6.0f}/{v1['ttft_p95']:<6.0f} {v1['tok_s'] / engine['tok_s']:>10.2f}"
    )
    if llama is not None:
        row += f" {llama['tok_s']:>12.1f} {llama['ttft_p50']:>6.0f}/{llama['ttft_p95']:<6.0f}"
    print(row, flush=True)


def print_cpu(engine: dict[str, float], sides: dict[str, dict[str, float]]) -> None:
    """The row's CPU per token: the engine alone's, then each side's by process role, its
    clients' and the bound that CPU puts on it (`cpu_bound`)."""
    parts = [f"engine alone {engine['cpu_ms_engine']:.2f}"]
    for name, side in sides.items():
        roles = ", ".join(
            f"{key.removeprefix('cpu_ms_')} {value:.2f}" for key, value in side.items() if key.startswith("cpu_ms_")
        )
        bound = cpu_bound(engine, side, num_cores())
        parts.append(f"{name}: {roles}" + (f" (at most {bound:.2f} of the engine)" if bound is not None else ""))
    print(f"{'':>7} CPU ms per token on {num_cores()} cores: " + "; ".join(parts), flush=True)


def num_cores() -> int:
    """The cores this process may run on (the stack it starts inherits them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    engine = load(args.model, args.device, args.dtype, max(args.client_counts))
    params = SamplingParams(
        greedy=True,
        max_new_tokens=args.num_tokens,
        ignore_eos=True,
        num_alternatives=NUM_ALTERNATIVES,
        use_prefix_cache=False,
    )
    run_batched(engine, prompts(engine, 2), params)  # warm up
    gguf = None
    if args.llama_server:
        gguf = Path(args.gguf) if args.gguf else gguf_source(EngineConfig(source=args.model))
        if gguf is None:
            raise SystemExit(f"--llama-server: {args.model} has no GGUF; pass --gguf PATH")
    with tempfile.TemporaryDirectory(prefix="stack-bench-") as tmp, contextlib.ExitStack() as services:
        work_dir = Path(tmp)
        stack = (
            Server(args.url)
            if args.url
            else services.enter_context(
                started_stack(
                    args.port or free_port(), args.redis_port or free_port(), args.dtype, args.device, work_dir
                )
            )
        )
        base_url = stack.base_url
        model = stack_model(base_url, args.model)
        model_id = model["id"]
        llama = (
            services.enter_context(started_llama_server(args.llama_server, gguf, args.num_tokens, work_dir))
            if gguf is not None
            else None
        )
        # the worker loads its model on its first request: one short answer first
        warm_up = run_clients(1, stack_client(base_url, model_id, ["Hello!"], 4))
        if warm_up[0].outcome != "generation.finished":
            raise SystemExit(f"the stack's warm-up request failed: {warm_up[0].outcome}")
        print(
            f"model {engine.info.name} ({engine.info.precision}, {engine.device}), {args.num_tokens} new tokens per "
            f"client, greedy, top-{NUM_ALTERNATIVES} alternatives every step; stack at {base_url}; times in ms"
        )
        header = f"{'clients':>7} {'engine tok/s':>10} {'ttft p50/p95':>13} {'stack tok/s':>9} {'ttft p50/p95':>13}"
        print(
            header
            + f" {'efficiency':>10} {'finished':>8} {'v1 tok/s':>9} {'ttft p50/p95':>13} {'efficiency':>10}"
            + (f" {'llama tok/s':>12} {'ttft p50/p95':>13}" if llama else "")
        )
        results: dict[str, dict[int, dict[str, float]]] = {"engine": {}, "stack": {}, "v1": {}, "llama": {}}
        for n in args.client_counts:
            rounds: dict[str, list[dict[str, float]]] = {side: [] for side in results}
            prompt_ids = prompts(engine, n)
            # Side by side, each round in turn (engine, stack, /v1, llama-server): a machine that
            # slows down for a while costs every side alike, and the medians drop a stray round.
            for _ in range(args.repeats):
                rounds["engine"].append(measured_engine(engine, prompt_ids, params))
                stack_client_n = stack_client(base_url, model_id, QUESTIONS[:n], args.num_tokens)
                rounds["stack"].append(measured_clients(n, stack_client_n, stack.pid))
                v1_client_n = v1_client(base_url, model["name"], QUESTIONS[:n], args.num_tokens)
                rounds["v1"].append(measured_clients(n, v1_client_n, stack.pid))
                if llama is not None:
                    llama_client_n = llama_server_client(llama.base_url, prompt_ids, args.num_tokens)
                    rounds["llama"].append(measured_clients(n, llama_client_n, llama.pid))
            for side, measured in rounds.items():
                if measured:
                    results[side][n] = median_of(measured)
            print_row(n, results["engine"][n], results["stack"][n], results["v1"][n], results["llama"].get(n))
            print_cpu(
                results["engine"][n],
                {side: results[side][n] for side in ("stack", "v1", "llama") if n in results[side]},
            )
    keys = report_keys(results["engine"], results["stack"], results["llama"], results["v1"], num_cores())
    sides = [*results["stack"].items(), *results["v1"].items()]
    keys["all_finished"] = int(all(s["num_finished"] == n for n, s in sides))
    print(format_keys(keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
