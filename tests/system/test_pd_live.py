"""Prefill/decode disaggregation over real processes: a prefill worker (`-Q prefill`) and a
decode worker (`-Q decode`) next to the colocated `gpu` worker of `live_stack`, driven over
the real WebSocket: the same tokens as colocated, a killed decode worker, a lost KV blob."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from tests.conftest import LiveStack, PDWorkers

from .wsclient import BrowserTab, ends_request, receive, receive_until, send, steps_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

# No prefix cache: the colocated worker must prefill exactly what the prefill worker does.
GREEDY = {"max_new_tokens": 24, "greedy": True, "ignore_eos": True, "use_prefix_cache": False}
SEEDED = {**GREEDY, "greedy": False, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
ENDLESS = {**GREEDY, "max_new_tokens": 2000}
QUESTION = "Write two sentences about a lighthouse keeper."


@pytest.fixture
def workers(pd_workers: PDWorkers) -> PDWorkers:
    pd_workers.ensure("prefill")
    pd_workers.ensure("decode")
    return pd_workers


def generate(tab: BrowserTab, overrides: dict[str, Any], **fields: Any) -> list[dict[str, Any]]:
    with tab.connect() as ws:
        send(ws, "generate", content=QUESTION, overrides=overrides, **fields)
        return receive_until(ws, ends_request)


def token_ids(events: list[dict[str, Any]]) -> list[int]:
    return [step["token_id"] for step in steps_of(events)]


def after_steps(num_steps: int) -> Callable[[dict[str, Any]], bool]:
    """A `receive_until` condition: `num_steps` tokens arrived (or the generation ended)."""
    seen: list[dict[str, Any]] = []

    def is_done(event: dict[str, Any]) -> bool:
        seen.append(event)
        return ends_request(event) or len(steps_of(seen)) >= num_steps

    return is_done


def stored_blob_keys(r: redis.Redis, timeout_s: float = 60) -> list[bytes]:
    """The KV blob's Redis keys, once the prefill worker stored them (just after the first token)."""
    deadline = time.monotonic() + timeout_s
    while not (keys := list(r.scan_iter(match="playground:kv:*"))):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no KV blob stored within {timeout_s}s")
        time.sleep(0.1)
    return keys


def only(events: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [event] = [event for event in events if event["type"] == kind]
    return event


@pytest.mark.parametrize("overrides", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_disaggregated_generates_the_tokens_of_colocated(
    tab: BrowserTab, workers: PDWorkers, overrides: dict[str, Any]
) -> None:
    colocated = generate(tab, overrides)
    disaggregated = generate(tab, overrides, pd=True)

    assert colocated[-1]["type"] == disaggregated[-1]["type"] == "generation.finished", disaggregated[-1]
    assert only(colocated, "generation.started")["worker"].startswith("e2e-gpu")
    assert len(token_ids(colocated)) == overrides["max_new_tokens"]
    assert token_ids(disaggregated) == token_ids(colocated)
    assert disaggregated[-1]["text"] == colocated[-1]["text"]

    handoff, stats = only(disaggregated, "generation.handoff"), disaggregated[-1]["stats"]
    assert only(disaggregated, "generation.started")["worker"] == handoff["prefill_worker"]
    assert handoff["prefill_worker"].startswith("e2e-prefill") and handoff["decode_worker"].startswith("e2e-decode")
    assert stats["kv_transfer_bytes"] == handoff["kv_transfer_bytes"] > stats["num_prompt_tokens"] * 1000
    status, record = tab.get_json(f"/api/generations/{disaggregated[-1]['generation_id']}/")
    assert status == 200 and record["stats"]["decode_worker"] == handoff["decode_worker"]


def test_a_decode_worker_killed_after_the_handoff_ends_with_one_worker_lost_error(
    tab: BrowserTab, workers: PDWorkers
) -> None:
    with tab.connect() as ws:
        send(ws, "generate", content=QUESTION, overrides=ENDLESS, pd=True)
        events = receive_until(ws, after_steps(8))
        assert "generation.handoff" in [event["type"] for event in events], events[-1]
        workers.services["decode"].kill()
        events += receive_until(ws, ends_request, timeout_s=60)

        error = events[-1]
        assert (error["type"], error["code"]) == ("generation.error", "worker_lost"), error
        with pytest.raises(TimeoutError):  # exactly one terminal event
            extra = receive(ws, timeout_s=5)
            pytest.fail(f"unexpected event after the terminal one: {extra}")
    assert workers.services["prefill"].is_alive()


def test_a_kv_blob_lost_before_the_decode_worker_came_ends_with_kv_handoff_failed(
    tab: BrowserTab, workers: PDWorkers, live_stack: LiveStack
) -> None:
    workers.services["decode"].kill()  # the handoff waits in the decode queue
    with tab.connect() as ws:
        send(ws, "generate", content=QUESTION, overrides=GREEDY, pd=True)
        events = receive_until(ws, after_steps(1))
        assert events[-1]["type"] == "generation.tokens", events[-1]
        r = redis.Redis.from_url(live_stack.redis_url)
        r.delete(*stored_blob_keys(r))
        workers.start("decode")
        events += receive_until(ws, ends_request, timeout_s=120)

    error = events[-1]
    assert (error["type"], error["code"]) == ("generation.error", "kv_handoff_failed"), error
    assert "gone" in error["message"]
