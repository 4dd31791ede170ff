"""Load-and-fault benchmark: one heavy request and a busy machine beside other users' short ones.

`python -m inference.bench overload [--quick] [--busy N] [--url http://host:port] [--model bundled]`

Owns: the scenario of issue 46, against the real stack (`make run`'s, started here on a fresh
SQLite DB, or `--url`'s): `--busy` CPU hogs (default 4, as other programs on a shared classroom
server or a laptop) start; the keyless local client sends the heavy request (`/v1/chat/completions` with 10,000
messages `{"role": "user", "content": "x"}`, `max_tokens` 4, not streamed) while another (an API key made here) sends 5
short ones in a row, 8 s apart (`hi`, `max_tokens` 4, streamed: time to first token from the send); then,
still busy, a request for another bundled model and one back (two model switches: loads); then, hogs
stopped, a second heavy request and a chat, and the worker left idle. Prints each request's
status and seconds, then one `key=value` line:
- `false_worker_lost`: answers that said `worker_lost` (nothing here kills a worker, so every one is false);
- `short_ok`, `short_ttft_p95_s`, `short_max_s`: the short requests answered 200, their time to first token;
- `heavy_status`, `heavy_code`, `heavy_s`: what the heavy request got, and when;
- `switches_ok`, `switch_max_s`: the two model switches' requests answered 200, the longer one's seconds;
- `running_after_answered`: generations `/metrics` shows running or waiting 5 s after every client was answered;
- `worker_rss_mb_before`, `worker_rss_mb_peak`, `worker_rss_mb_after_hostile`, `worker_rss_mb_after`: the
  Celery worker's resident memory before the hostile requests, its peak over the run (sampled every
  0.2 s), 5 s after the first heavy request was answered (before the switches), and at the end after
  20 s idle; `rss_hostile_over_before`, `rss_after_over_before`.
Must not know: the stack's internals (driven over HTTP and /proc only).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from inference.bench import format_keys, starting_env
from inference.bench.stack import REPO_DIR, free_port, stack_model, started_stack

NUM_HEAVY_MESSAGES = 10_000
NUM_SHORT = 5
SHORT_TIMEOUT_S = 120.0
SHORT_SPACING_S = 8.0
HEAVY_TIMEOUT_S = 600.0


@dataclass
class Answer:
    """One request's outcome: HTTP status, error code (if any), seconds to its first token and to its end."""

    status: int = 0
    code: str = ""
    first_s: float | None = None
    total_s: float = 0.0


def post(base_url: str, body: dict, timeout_s: float, api_key: str = "") -> Answer:
    """POSTs to /v1/chat/completions (keyless from localhost, or as `api_key`'s client); a streamed
    body's first content chunk times `first_s`."""
    address = urlparse(base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=timeout_s)
    answer, sent = Answer(), time.perf_counter()
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        response = connection.getresponse()
        answer.status = response.status
        if body.get("stream") and response.status == 200:
            for line in response:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                chunk = json.loads(line[len(b"data: ") :])
                if "error" in chunk:
                    answer.code = chunk["error"].get("code") or "error"
                elif answer.first_s is None and any(c.get("delta", {}).get("content") for c in chunk["choices"]):
                    answer.first_s = time.perf_counter() - sent
        else:
            payload = json.loads(response.read() or b"{}")
            answer.code = (payload.get("error") or {}).get("code") or ""
    except (OSError, http.client.HTTPException) as exc:
        answer.code = f"client: {type(exc).__name__}"
    finally:
        connection.close()
    answer.total_s = time.perf_counter() - sent
    return answer


def hog() -> None:
    while True:
        pass


def worker_pid(root_pid: int) -> int | None:
    """The Celery worker among `root_pid`'s children (`make run`'s supervisor starts it)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(root_pid) and b"celery" in cmdline:
            return int(status.parent.name)
    return None


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class RssSampler(threading.Thread):
    def __init__(self, pid: int | None) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_mb, self.stopped = pid, 0.0, threading.Event()

    def run(self) -> None:
        while self.pid and not self.stopped.wait(0.2):
            self.peak_mb = max(self.peak_mb, rss_mb(self.pid))


def num_running(base_url: str) -> float:
    """Generations every worker reports running or waiting (`/metrics`)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(("playground_requests_running{", "playground_requests_waiting{"))
    )


def heavy_body(model: str) -> dict:
    messages = [{"role": "user", "content": "x"}] * NUM_HEAVY_MESSAGES
    return {"model": model, "messages": messages, "max_tokens": 4}


def short_body(model: str) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}


def run_scenario(base_url: str, model: str, num_busy: int, pid: int | None, api_key: str) -> dict[str, float | str]:
    """The heavy requests come from the keyless local client, the short ones from `api_key`'s:
    another user, whom the engine's fair prefill share protects (one client's own requests queue
    behind each other). Then, still busy, a request for the other bundled model and one back:
    two model switches, each a load that keeps the worker's Python busy for seconds."""
    other_model = bundled_other_than(base_url, model)
    warm_up = post(base_url, short_body(model), HEAVY_TIMEOUT_S)  # the worker has its model loaded
    print(f"warm-up: {warm_up}", flush=True)
    before_mb = rss_mb(pid) if pid else 0.0
    sampler = RssSampler(pid)
    sampler.start()
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(num_busy)]
    for process in hogs:
        process.start()
    heavy: list[Answer] = []
    heavy_thread = threading.Thread(target=lambda: heavy.append(post(base_url, heavy_body(model), HEAVY_TIMEOUT_S)))
    heavy_thread.start()
    time.sleep(1.0)  # the heavy request is in flight
    shorts = []
    for i in range(NUM_SHORT):  # spread over the heavy request's life, not only its first seconds
        shorts.append(post(base_url, short_body(model), SHORT_TIMEOUT_S, api_key))
        print(f"short {i}: {shorts[-1]}", flush=True)
        time.sleep(SHORT_SPACING_S)
    heavy_thread.join()
    print(f"heavy: {heavy[0]}", flush=True)
    time.sleep(5.0)
    after_hostile_mb = rss_mb(pid) if pid else 0.0  # before the switches load other weights
    switches = [post(base_url, short_body(name), HEAVY_TIMEOUT_S, api_key) for name in (other_model, model)]
    print(f"model switches: {switches}", flush=True)
    for process in hogs:
        process.kill()
    time.sleep(5.0)
    running = num_running(base_url)
    second = post(base_url, heavy_body(model), HEAVY_TIMEOUT_S)
    chat = post(base_url, short_body(model), SHORT_TIMEOUT_S, api_key)
    print(f"second heavy: {second}; chat: {chat}", flush=True)
    time.sleep(20.0)
    sampler.stopped.set()
    after_mb = rss_mb(pid) if pid else 0.0
    answers = [*shorts, *heavy, *switches, second, chat]
    ttfts = [a.first_s for a in shorts if a.first_s is not None]
    return {
        "false_worker_lost": sum(a.code == "worker_lost" for a in answers),
        "short_ok": sum(a.status == 200 and not a.code for a in shorts),
        "short_ttft_p95_s": round(max(ttfts), 2) if ttfts else -1,  # of 5: the largest
        "short_ttft_median_s": round(statistics.median(ttfts), 2) if ttfts else -1,
        "short_max_s": round(max(a.total_s for a in shorts), 2),
        "heavy_status": heavy[0].status,
        "heavy_code": heavy[0].code or "none",
        "heavy_s": round(heavy[0].total_s, 2),
        "switches_ok": sum(a.status == 200 and not a.code for a in switches),
        "switch_max_s": round(max(a.total_s for a in switches), 2),
        "running_after_answered": running,
        "worker_rss_mb_before": round(before_mb),
        "worker_rss_mb_peak": round(sampler.peak_mb),
        "worker_rss_mb_after_hostile": round(after_hostile_mb),
        "worker_rss_mb_after": round(after_mb),
        "rss_hostile_over_before": round(after_hostile_mb / before_mb, 2) if before_mb else -1,
        "rss_after_over_before": round(after_mb / before_mb, 2) if before_mb else -1,
    }


def create_api_key(work_dir: Path) -> str:
    """A key for the short requests' client, in the started stack's database."""
    env = starting_env() | {
        "DATABASE_URL": f"sqlite:///{work_dir / 'db.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "playground.settings",
    }
    command = [sys.executable, "-m", "django", "create_api_key", "overload-bench"]
    return subprocess.run(command, cwd=REPO_DIR, env=env, check=True, capture_output=True, text=True).stdout.strip()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m inference.bench overload", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="accepted for symmetry: the scenario is fixed")
    parser.add_argument("--busy", type=int, default=4, help="CPU-hogging processes beside the stack (default 4)")
    parser.add_argument("--url", help="measure a running stack instead of starting one (no worker RSS then)")
    parser.add_argument("--api-key", default="", help="with --url: the short requests' key (create_api_key)")
    parser.add_argument("--model", help="the model the requests name, as a source (default: the stack's default model)")
    return parser.parse_args(argv)


def model_name(base_url: str, source: str | None) -> str:
    """The `/v1` name of the model `source` names, else of the stack's default model."""
    if source:
        return stack_model(base_url, source)["name"]
    with urllib.request.urlopen(base_url + "/api/models/", timeout=60) as response:
        return next(m["name"] for m in json.loads(response.read()) if m.get("is_default"))


def bundled_other_than(base_url: str, model: str) -> str:
    """Another bundled model's `/v1` name: a request for it makes the worker switch models."""
    with urllib.request.urlopen(base_url + "/api/models/", timeout=60) as response:
        models = json.loads(response.read())
    return next(m["name"] for m in models if m["name"] != model and m["name"].endswith("(bundled)"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.url:
        model = model_name(args.url.rstrip("/"), args.model)
        print(format_keys(run_scenario(args.url.rstrip("/"), model, args.busy, None, args.api_key)))
        return 0
    with tempfile.TemporaryDirectory(prefix="overload-bench-") as work_dir:
        with started_stack(free_port(), free_port(), "auto", "auto", Path(work_dir)) as server:
            model = model_name(server.base_url, args.model)
            pid = worker_pid(server.pid) if server.pid else None
            print(f"stack at {server.base_url}, worker pid {pid}, model {model!r}", flush=True)
            api_key = create_api_key(Path(work_dir))
            print(format_keys(run_scenario(server.base_url, model, args.busy, pid, api_key)))
    return 0
