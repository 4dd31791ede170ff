"""A room full of people: 8 browsers generate at once on one worker process, which batches
them (continuous batching), and every one gets its whole, correct answer; the serving view
shows them sharing steps and /metrics counts them. Real daphne, Redis and Celery worker."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
from websockets.sync.client import connect

from inference import EngineConfig, SamplingParams
from inference.engine import Engine

from .wsclient import BrowserTab, ends_request, receive_until, send, streamed_text

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

NUM_CLIENTS = 8
NUM_TOKENS = 24
QUESTIONS = [f"Write one sentence about the number {n}." for n in range(NUM_CLIENTS)]
# Plain greedy, as the references below (the default preset adds a repetition penalty).
PARAMS = {
    "max_new_tokens": NUM_TOKENS,
    "greedy": True,
    "repetition_penalty": 1.0,
    "ignore_eos": True,
    "num_alternatives": 3,
}


def expected_answers() -> dict[str, str]:
    """Each question's greedy answer, computed alone in this process from the same rendered prompt."""
    engine = Engine.load(EngineConfig(source="bundled", device="cpu", dtype="float32"))
    params = SamplingParams(greedy=True, max_new_tokens=NUM_TOKENS, ignore_eos=True, use_prefix_cache=False)
    answers = {}
    for question in QUESTIONS:
        prompt = engine.prompts.render_chat([{"role": "user", "content": question}]).text
        answers[question] = list(engine.generate(engine.prompts.encode(prompt), params))[-1].text
    return answers


def ask(tab: BrowserTab, question: str, results: dict, barrier: threading.Barrier) -> None:
    with tab.connect() as ws:
        barrier.wait()
        send(ws, "generate", request_id="r", content=question, overrides=PARAMS)
        results[question] = receive_until(ws, ends_request, timeout_s=300)


def test_eight_clients_at_once_all_get_their_whole_answer_from_one_batching_worker(live_stack) -> None:
    live_stack.ensure_worker()
    serving_events: list[dict] = []
    stop_watching = threading.Event()

    def watch_serving() -> None:
        with connect(live_stack.ws_url.replace("/ws/generate/", "/ws/serving/"), origin=live_stack.base_url) as ws:
            while not stop_watching.is_set():
                try:
                    serving_events.append(json.loads(ws.recv(timeout=0.5)))
                except TimeoutError:
                    continue

    watcher = threading.Thread(target=watch_serving, daemon=True)
    watcher.start()
    tabs = [BrowserTab(live_stack.base_url, live_stack.ws_url) for _ in QUESTIONS]
    for tab in tabs:
        assert tab.get("/")[0] == 200
    results: dict[str, list[dict]] = {}
    barrier = threading.Barrier(NUM_CLIENTS)
    threads = [threading.Thread(target=ask, args=(tab, q, results, barrier)) for tab, q in zip(tabs, QUESTIONS)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=400)
    elapsed = time.monotonic() - started
    stop_watching.set()
    watcher.join(timeout=5)
    # Read now: an idle worker's metrics snapshot expires (SNAPSHOT_TTL_S, 30 s), and the
    # references below take longer than that on a busy machine.
    with urllib.request.urlopen(live_stack.base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()

    expected = expected_answers()
    for question in QUESTIONS:
        events = results[question]
        finished = events[-1]
        assert finished["type"] == "generation.finished", finished
        assert finished["finish_reason"] == "length" and finished["stats"]["num_generated_tokens"] == NUM_TOKENS
        assert streamed_text(events) == finished["text"] == expected[question]
        assert [e["type"] for e in events].count("generation.finished") == 1
    shared = [e["step"] for e in serving_events if e.get("type") == "serving.step"]
    assert shared, "the serving view showed no step"
    assert max(len(step["chunks"]) for step in shared) >= 4, "the requests never shared a step"
    print(
        f"{NUM_CLIENTS} clients x {NUM_TOKENS} tokens in {elapsed:.1f} s; "
        f"widest step: {max(len(step['chunks']) for step in shared)} requests"
    )

    counted = [line for line in text.splitlines() if line.startswith("playground_generated_tokens_total{")]
    assert counted and sum(float(line.rsplit(" ", 1)[1]) for line in counted) >= NUM_CLIENTS * NUM_TOKENS
    assert "playground_time_to_first_token_seconds_bucket{" in text
    assert "playground_kv_blocks_total{" in text


def test_fifty_clients_at_once_each_get_exactly_one_terminal_event(live_stack) -> None:
    """A class opening the page together (bounded: 50 sockets, one short message each, all to
    127.0.0.1): none is lost, none is answered twice."""
    live_stack.ensure_worker()
    num_clients = 50
    tabs = [BrowserTab(live_stack.base_url, live_stack.ws_url) for _ in range(num_clients)]
    results: dict[str, list[dict]] = {}
    barrier = threading.Barrier(num_clients)
    questions = [f"Say the number {n}." for n in range(num_clients)]

    def ask_briefly(tab: BrowserTab, question: str) -> None:
        with tab.connect() as ws:
            barrier.wait()
            send(ws, "generate", content=question, overrides={"max_new_tokens": 4, "greedy": True, "ignore_eos": True})
            events = receive_until(ws, ends_request, timeout_s=300)
            try:  # nothing more may come for this generation
                events.append(json.loads(ws.recv(timeout=1.0)))
            except TimeoutError:
                pass
            results[question] = events

    threads = [threading.Thread(target=ask_briefly, args=(tab, q)) for tab, q in zip(tabs, questions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=400)
    assert len(results) == num_clients
    for question, events in results.items():
        terminal = [e for e in events if e["type"] in ("generation.finished", "generation.error", "error")]
        assert len(terminal) == 1, (question, [e["type"] for e in events])
        assert terminal[0]["type"] == "generation.finished", terminal[0]
        assert terminal[0]["stats"]["num_generated_tokens"] == 4
