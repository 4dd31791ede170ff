"""The serving-stack benchmark (`python -m inference.bench stack`): its arguments, its report
(efficiency is the stack's aggregate over the engine's, the last line parses back), how it reads
its clients, and its llama-server client against a fake server speaking that server's stream.
Nothing here is timed, and nothing starts the stack (tests/system does that)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from inference import bench
from inference.bench import format_keys, parse_keys
from inference.bench.stack import (
    ClientRun,
    cpu_bound,
    llama_server_client,
    llama_server_env,
    measured_clients,
    median_of,
    parse_args,
    process_tree_cpu_s,
    report_keys,
    run_clients,
    stack_model_id,
    summarize_clients,
    v1_client,
)


def test_quick_is_one_and_eight_clients_of_fewer_tokens_and_the_full_run_adds_sixteen() -> None:
    quick, full = parse_args(["--quick"]), parse_args([])
    assert (quick.client_counts, quick.num_tokens, quick.repeats) == ((1, 8), 32, 1)
    assert (full.client_counts, full.num_tokens, full.repeats) == ((1, 8, 16), 64, 3)
    chosen = parse_args(["--clients", "2,4", "--max-new-tokens", "16", "--llama-server", "/opt/llama-server"])
    assert (chosen.client_counts, chosen.num_tokens, chosen.llama_server) == ((2, 4), 16, "/opt/llama-server")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--clients", "eight"], "--clients 'eight'"),
        (["--clients", "0"], "(0,)"),
        (["--clients", "1,17"], "(1, 17)"),  # more clients than distinct questions
        (["--repeats", "-1"], "--repeats -1"),
        (["--max-new-tokens", "1"], "--max-new-tokens >= 2"),
        (["--url", "http://example.com:8000"], "this machine only"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value(argv: list[str], says: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def side(tok_s: float, ttft_p95: float = 100.0) -> dict[str, float]:
    return {"tok_s": tok_s, "ttft_p50": ttft_p95 / 2, "ttft_p95": ttft_p95}


def test_efficiency_is_the_stack_over_the_engine_and_the_last_line_parses_back() -> None:
    engine = {1: side(40.0), 8: side(160.0), 16: side(200.0)}
    stack = {1: side(20.0), 8: side(144.0, ttft_p95=480.0), 16: side(190.0)}
    line = format_keys(report_keys(engine, stack, llama={8: side(120.0)}))
    keys = parse_keys(line)
    assert keys["stack_efficiency_1"] == pytest.approx(0.5)
    assert keys["stack_efficiency_8"] == pytest.approx(0.9)
    assert keys["stack_efficiency_16"] == pytest.approx(0.95)
    assert keys["stack_tok_s_8"] == 144.0 and keys["stack_ttft_p95_ms_8"] == 480.0
    assert keys["vs_llama_server_8"] == pytest.approx(1.2)
    assert "vs_llama_server_1" not in keys  # llama-server ran at 8 only


def test_rounds_are_merged_by_their_medians_and_the_worst_rounds_finished_count() -> None:
    rounds = [
        {"tok_s": 240.0, "ttft_p95": 300.0, "num_finished": 8.0},
        {"tok_s": 90.0, "ttft_p95": 900.0, "num_finished": 7.0},  # a stray slow round
        {"tok_s": 250.0, "ttft_p95": 280.0, "num_finished": 8.0},
    ]
    assert median_of(rounds) == {"tok_s": 240.0, "ttft_p95": 300.0, "num_finished": 7.0}


def test_without_llama_server_there_is_no_comparison_with_it() -> None:
    keys = report_keys({1: side(40.0)}, {1: side(30.0)}, llama={})
    assert not any(key.startswith(("vs_llama", "llama")) for key in keys)


def test_parse_keys_refuses_a_line_that_is_not_key_value_pairs() -> None:
    assert parse_keys("all_finished=1 model=smol") == {"all_finished": 1.0, "model": "smol"}
    with pytest.raises(ValueError, match="'stack_tok_s_8'"):
        parse_keys("stack_tok_s_8")


def test_clients_are_read_from_their_own_send_and_one_that_failed_still_counts_in_finished() -> None:
    runs = [
        ClientRun(sent=10.0, token_times=[10.1, 10.2, 10.3], ended=10.3, outcome="generation.finished"),
        ClientRun(sent=10.5, token_times=[10.9, 11.0, 11.1, 11.2], ended=11.2, outcome="generation.finished"),
        ClientRun(sent=10.2, outcome="generation.error worker_lost: ..."),
    ]
    summary = summarize_clients(runs)
    assert summary["tok_s"] == pytest.approx(7 / 1.2)  # all tokens over first send to last token
    assert summary["ttft_p50"] == pytest.approx(250.0)  # 100 ms and 400 ms, each from its own send
    assert summary["num_finished"] == 2
    with pytest.raises(RuntimeError, match="no client got a token"):
        summarize_clients([ClientRun(outcome="error rate_limited: ...")])


def test_a_client_that_dies_before_sending_releases_the_others() -> None:
    def one_client(index: int, barrier: threading.Barrier, run: ClientRun) -> None:
        if index == 0:
            raise ConnectionRefusedError("nobody listens")
        barrier.wait(timeout=30)  # broken by the failed client: no 30 s wait
        run.outcome = "sent"

    runs = run_clients(3, one_client)
    assert runs[0].outcome == "ConnectionRefusedError: nobody listens"
    assert all(run.outcome.startswith("BrokenBarrierError") for run in runs[1:])


class FakeServer(BaseHTTPRequestHandler):
    """Answers GET /api/models as the playground does and POST /completion as llama-server streams."""

    posted: list[dict] = []

    def do_GET(self) -> None:
        models = [
            {"id": 3, "name": "Qwen2.5-Coder-0.5B-Instruct (bundled)", "unavailable": None},
            {"id": 7, "name": "SmolLM2-135M-Instruct (bundled)", "unavailable": None},
        ]
        self.answer(json.dumps(models).encode(), "application/json")

    def do_POST(self) -> None:
        FakeServer.posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        if self.path == "/v1/chat/completions":  # the playground's OpenAI API: coalesced tokens per chunk
            chunks = [
                {"choices": [{"delta": {"content": "ab"}, "logprobs": {"content": [{}, {}]}, "finish_reason": None}]},
                {"choices": [{"delta": {"content": "c"}, "logprobs": {"content": [{}]}, "finish_reason": "length"}]},
            ]
            lines = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]
        else:  # llama-server's /completion
            chunks = [{"content": "a", "stop": False}, {"content": "b", "stop": False}, {"content": "", "stop": True}]
            lines = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
        self.answer(b"".join(lines), "text/event-stream")

    def answer(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_stack_model_is_found_by_its_catalogue_name(fake_server) -> None:
    assert stack_model_id(fake_server, "bundled") == 7
    assert stack_model_id(fake_server, "bundled:qwen2.5-coder-0.5b-instruct") == 3
    with pytest.raises(SystemExit, match="no model named 'gemma'"):
        stack_model_id(fake_server, "gemma")


def test_llama_server_clients_send_the_same_token_ids_greedy_and_count_streamed_tokens(fake_server) -> None:
    FakeServer.posted.clear()
    runs = run_clients(2, llama_server_client(fake_server, [[1, 2, 3], [4, 5]], num_tokens=2))
    assert [(len(r.token_times), r.outcome) for r in runs] == [(2, "generation.finished")] * 2
    bodies = sorted(FakeServer.posted, key=lambda body: body["prompt"])
    assert [b["prompt"] for b in bodies] == [[1, 2, 3], [4, 5]]
    assert all(b["temperature"] == 0.0 and b["n_predict"] == 2 and b["ignore_eos"] and b["stream"] for b in bodies)


def test_v1_clients_stream_greedy_chat_completions_and_count_every_coalesced_token(fake_server) -> None:
    FakeServer.posted.clear()
    runs = run_clients(2, v1_client(fake_server, "SmolLM2-135M-Instruct (bundled)", ["Hi?", "Why?"], num_tokens=3))
    assert [(len(r.token_times), r.outcome) for r in runs] == [(3, "generation.finished")] * 2
    bodies = sorted(FakeServer.posted, key=lambda body: body["messages"][0]["content"])
    assert [b["messages"] for b in bodies] == [[{"role": "user", "content": q}] for q in ("Hi?", "Why?")]
    assert all(b["model"] == "SmolLM2-135M-Instruct (bundled)" and b["stream"] and b["max_tokens"] == 3 for b in bodies)
    assert all((b["preset"], b["repetition_penalty"], b["top_logprobs"]) == ("Greedy", 1.0, 20) for b in bodies)
    assert all(b["use_prefix_cache"] is False and b["ignore_eos"] for b in bodies)  # as the engine's side
    keys = report_keys({8: side(160.0)}, {8: side(144.0)}, llama={}, v1={8: side(136.0, ttft_p95=300.0)})
    assert keys["v1_efficiency_8"] == pytest.approx(0.85) and keys["v1_ttft_p95_ms_8"] == 300.0


def test_llama_server_runs_on_its_own_openmp_setting_whatever_the_caller_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(bench, "_STARTING_OMP_WAIT_POLICY", "PASSIVE")  # as `OMP_WAIT_POLICY=PASSIVE python -m ...`
    monkeypatch.setenv("SOME_SETTING", "kept")
    env = llama_server_env()
    assert "OMP_WAIT_POLICY" not in env and env["SOME_SETTING"] == "kept"
    assert bench.starting_env()["OMP_WAIT_POLICY"] == "PASSIVE"  # the stack's worker still gets the caller's


BURN = """
import ctypes, sys, threading, time

def burn(seconds):  # CPU time, not wall time: a busy machine only makes it take longer
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        pass

burned = threading.Event()

def engine_thread():  # lives on, as the worker's engine threads do
    ctypes.CDLL(None).prctl(15, b"pg-kernels", 0, 0, 0)  # PR_SET_NAME, as kernels/threads.c names its helpers
    burn(0.6)
    burned.set()
    time.sleep(3600)

threading.Thread(target=engine_thread, daemon=True).start()
burn(0.2)
burned.wait()
print("done", flush=True)
sys.stdin.read()  # stays alive (its CPU readable) until the test closes stdin
"""
# The parent starts the burner with "daphne" in its command line only (not in the parent's own).
PARENT = "import os, subprocess, sys; subprocess.run([sys.executable, '-c', os.environ['BURN'], os.environ['ROLE']])"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_started_servers_cpu_is_counted_by_role_with_the_engines_threads_apart() -> None:
    environment = {**os.environ, "BURN": BURN, "ROLE": "daphne"}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment
    )
    try:
        assert parent.stdout.readline().strip() == "done"
        by_role = process_tree_cpu_s(parent.pid)
    finally:
        parent.stdin.close()
        parent.wait(timeout=30)
    assert set(by_role) == {"other", "web", "engine"}  # the parent, the burner, its named thread
    assert 0.55 <= by_role["engine"] < 1.0  # the named thread's 0.6 s
    assert 0.15 <= by_role["web"] < 0.5  # the main thread's 0.2 s and its start, without the named thread's
    assert process_tree_cpu_s(parent.pid) == {}  # gone: nothing to count


def test_the_cpu_bound_is_what_the_cores_give_at_the_cpu_a_token_cost() -> None:
    engine = side(400.0) | {"cpu_ms_engine": 5.0}  # two busy cores: 2 / 5 ms = 400 tok/s
    stack = side(300.0) | {"cpu_ms_engine": 5.0, "cpu_ms_worker": 0.5, "cpu_ms_web": 0.4, "cpu_ms_clients": 0.1}
    assert cpu_bound(engine, stack, num_cores=2) == pytest.approx(2000 / 6.0 / 400.0)  # 0.83: CPU binds
    assert cpu_bound(engine, stack, num_cores=4) > 1  # spare cores: the CPU it spends does not bind it
    assert cpu_bound(engine, side(300.0) | {"cpu_ms_clients": 0.1}, num_cores=2) is None  # --url: not measured
    keys = report_keys({8: engine}, {8: stack}, llama={}, num_cores=2)
    assert keys["stack_cpu_ms_per_token_8"] == pytest.approx(5.9)  # every role but the clients
    assert keys["client_cpu_ms_per_token_8"] == 0.1 and keys["engine_cpu_ms_per_token_8"] == 5.0
    assert keys["stack_cpu_bound_8"] == pytest.approx(0.8333, rel=1e-3)


def test_a_rounds_cpu_is_read_once_every_client_is_ready_and_before_any_sends() -> None:
    order: list[str] = []

    def one_client(index: int, barrier: threading.Barrier, run: ClientRun) -> None:
        order.append("ready")
        barrier.wait(timeout=30)
        order.append("sent")
        run.token_times = [1.0, 2.0]
        run.sent, run.outcome = 0.5, "generation.finished"

    summary = measured_clients(3, one_client, server_pid=None)
    assert order[:3] == ["ready"] * 3 and order[3:] == ["sent"] * 3
    assert summary["num_finished"] == 3 and summary["cpu_ms_clients"] >= 0
    assert not any(key.startswith("cpu_ms_") and key != "cpu_ms_clients" for key in summary)  # no server pid
