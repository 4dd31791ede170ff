"""Measure a room: N browsers send a chat message at the same moment to a running playground
(`make run`), each asking for `--tokens` new tokens, and report time to first token (from
the send) and aggregate tokens/s. 127.0.0.1 only; bounded (one message per client).

    .venv/bin/python scripts/room_load.py --clients 8 --tokens 64 [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from urllib.parse import urlparse

from websockets.sync.client import connect


def one_client(url: str, index: int, tokens: int, barrier: threading.Barrier, out: dict) -> None:
    host = urlparse(url).netloc
    assert urlparse(url).hostname in ("127.0.0.1", "localhost"), "load goes to this machine only"
    with connect(f"ws://{host}/ws/generate/", origin=url, open_timeout=30) as ws:
        barrier.wait()
        sent = time.perf_counter()
        overrides = {"max_new_tokens": tokens, "ignore_eos": True, "greedy": True, "num_alternatives": 20}
        ws.send(
            json.dumps(
                {
                    "command": "generate",
                    "content": f"Tell me a story about lighthouse number {index}.",
                    "overrides": overrides,
                }
            )
        )
        first, count = None, 0
        while True:
            event = json.loads(ws.recv(timeout=600))
            if event["type"] == "generation.tokens":
                first = first or time.perf_counter()
                count += len(event["steps"])
            if event["type"] in ("generation.finished", "generation.error", "error"):
                out[index] = {
                    "ttft_s": (first or time.perf_counter()) - sent,
                    "tokens": count,
                    "end": time.perf_counter(),
                    "sent": sent,
                    "type": event["type"],
                }
                return


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    out: dict[int, dict] = {}
    barrier = threading.Barrier(args.clients)
    threads = [
        threading.Thread(target=one_client, args=(args.url, i, args.tokens, barrier, out)) for i in range(args.clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ttft = sorted(r["ttft_s"] for r in out.values())
    wall = max(r["end"] for r in out.values()) - min(r["sent"] for r in out.values())
    num_tokens = sum(r["tokens"] for r in out.values())
    print(
        f"{args.clients} clients x {args.tokens} tokens: all finished: "
        f"{all(r['type'] == 'generation.finished' for r in out.values())}"
    )
    print(
        f"ttft_p50_s={statistics.median(ttft):.2f} ttft_p95_s={ttft[max(0, round(0.95 * len(ttft)) - 1)]:.2f} "
        f"ttft_max_s={ttft[-1]:.2f} aggregate_tok_s={num_tokens / wall:.1f} wall_s={wall:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
