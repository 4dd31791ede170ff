"""The random-weights DeepSeek-V3 demo through the real stack: `manage.py demo_model` registers
it, a browser generates with it on a real worker (the generic transformers runner), and the KV
bytes the worker measures are MLA's latent, as the architecture card computes them."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import run_prepare_step

from .wsclient import BrowserTab, ends_request, receive_until, send, steps_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def test_demo_model_generates_with_the_latent_cache(live_stack, tab: BrowserTab) -> None:
    run_prepare_step("demo-model", [sys.executable, "-m", "django", "demo_model"], live_stack.env)
    status, models = tab.get_json("/api/models/")
    assert status == 200
    demo = next(m for m in models if "random weights" in m["name"])
    assert not demo["is_default"]

    overrides = {"max_new_tokens": 8, "greedy": True, "ignore_eos": True}
    with tab.connect() as ws:
        send(ws, "generate", request_id="d1", content="Hello!", model_id=demo["id"], overrides=overrides)
        events = receive_until(ws, ends_request)
    assert events[-1]["type"] == "generation.finished", events[-1]
    assert len(steps_of(events)) == 8
    prefilled = next(e for e in events if e["type"] == "generation.prefilled")

    status, card = tab.get_json(f"/api/models/{demo['id']}/architecture/?context=1")
    assert status == 200, card
    assert card["kv_cache"]["form"] == "mla_latent" and card["kv_cache"]["dtype"] == "float32"
    # measured on the worker: 4 layers x (32 latent + 16 rope key) x 4 bytes per cached token
    assert prefilled["kv_cache_bytes"] == card["kv_cache"]["bytes_per_token"] * prefilled["num_prompt_tokens"]
    assert card["kv_cache"]["bytes_per_token"] == 768 < card["kv_cache"]["expanded_bytes_per_token"]
