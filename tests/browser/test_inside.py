"""The explorer's "Inside this step" views and its exact processed column, in a real browser
against the real stack: the numbers shown against the engine's own (the step records the
worker streamed, a real rerun, the model info)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from inference.introspect import architecture
from inference.models.bundled import BUNDLED_FOLDER_NAME

from .test_explorer import all_steps, next_token, open_explorer
from .ui import chart_data, events, set_range, visible_piece, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


def test_processed_column_is_the_engines_exact_distribution(page):
    """The issue's case: temperature 1.8 and top-p 0.5 kept 2 tokens at 79.9% in the old preview."""
    open_explorer(page)
    set_range(page, "#ex-temperature", 1.8)
    set_range(page, "#ex-top-p", 0.5)
    next_token(page, 1)
    step = all_steps(page)[-1]
    expect(page.locator("#ex-processed-head")).to_have_attribute("data-exact", "true")
    processed = chart_data(page, "dist-chart")["datasets"][1]["data"]
    engine = {a["token_id"]: a["prob"] for a in step["top_processed"]}
    for alt, prob in zip(step["top_raw"][:20], processed):
        if alt["token_id"] in engine:
            assert prob == pytest.approx(engine[alt["token_id"]], rel=1e-3)
    chosen = next(p for a, p in zip(step["top_raw"], processed) if a["token_id"] == step["token_id"])
    assert chosen == pytest.approx(math.exp(step["logprob"]), rel=1e-3)  # the "sampled p" badge agrees


def test_sampler_stages(page, screenshot_dir):
    open_explorer(page)
    set_range(page, "#ex-temperature", 0.8)
    set_range(page, "#ex-top-k", 10)
    next_token(page, 1)
    step = all_steps(page)[-1]
    page.click('[data-inside="waterfall"]')
    rows = page.locator("#inside-waterfall tbody tr")
    expect(rows).to_have_count(3)
    assert [rows.nth(i).get_attribute("data-stage") for i in range(3)] == ["raw", "temperature", "top_k"]
    top_k = rows.nth(2)
    assert float(top_k.locator("[data-sampled-prob]").get_attribute("data-sampled-prob")) == pytest.approx(
        math.exp(step["logprob"]), rel=1e-3
    )
    expect(top_k.locator("td").nth(1)).to_have_text("10")
    page.screenshot(path=str(screenshot_dir / "inside-waterfall.png"), full_page=True)


def test_what_if_is_a_real_rerun(page):
    open_explorer(page)
    set_range(page, "#ex-run-length", 8)
    page.click("#ex-run")
    wait_for_events(page, "generation.finished", 1)
    expect(page.locator("#ex-step")).to_be_enabled()
    original = [s["token_id"] for s in all_steps(page)]
    set_range(page, "#ex-temperature", 0)  # what would greedy have written?
    page.click('[data-inside="whatif"]')
    expect(page.locator("#whatif-summary")).to_contain_text("Seed 3")
    drawn = [
        int(x) for x in page.locator("#inside-whatif tbody tr").evaluate_all("rs => rs.map(r => r.dataset.tokenId)")
    ]
    page.click("#ex-reset")
    page.click("#ex-run")  # a real greedy run of the same text
    wait_for_events(page, "generation.finished", 2)
    expect(page.locator("#ex-step")).to_be_enabled()
    rerun = [s["token_id"] for s in all_steps(page)][len(original) :]
    assert drawn == rerun[: len(drawn)]
    if len(drawn) < len(original) or drawn != original[: len(drawn)]:
        assert drawn[:-1] == original[: len(drawn) - 1] and drawn[-1] != original[len(drawn) - 1]


def test_layers_and_kv_cache(page, screenshot_dir):
    open_explorer(page)
    next_token(page, 1)
    next_token(page, 2)
    step = all_steps(page)[-1]
    model = events(page, "generation.started")[-1]["model"]
    page.click('[data-inside="lens"]')
    rows = page.locator("#lens-table tbody tr")
    expect(rows).to_have_count(model["num_layers"] + 1)
    last_top = rows.last.locator(".piece").first
    expect(last_top).to_have_text(visible_piece(step["top_raw"][0]["piece"]))  # the model's own output
    grid = page.locator("#attention-grid tbody tr")
    expect(grid).not_to_have_count(0)
    page.select_option("#lens-layer", "5")
    expect(page.locator("#lens-layer")).to_have_value("5")
    page.screenshot(path=str(screenshot_dir / "inside-lens.png"), full_page=True)
    page.click('[data-inside="kv"]')
    per_token = page.evaluate(
        "async (n) => (await import('/static/js/format.js')).fmtBytes(n)", model["kv_bytes_per_token"]
    )
    expect(page.locator("#kv-per-token")).to_have_text(per_token)


LONG_PROMPT = (
    "The lighthouse stood on the rocks above the harbour. Every night the keeper climbed the stairs, lit the"
    " lamp and watched the ships pass by. One stormy evening a small boat appeared near the cliffs, and the keeper"
)


def shown(page, selector: str) -> list[str]:
    return page.locator(selector).all_inner_texts()


def fmt_si(page, value: float, unit: str) -> str:
    return page.evaluate("async ([v, u]) => (await import('/static/js/format.js')).fmtSi(v, u)", [value, unit])


def test_roofline_places_prefill_and_decode(page, screenshot_dir):
    """Prefill and decode of a real run on the worker's measured roofline: the timeline is the
    engine's records, the FLOPs are architecture.py's counts for the run's tokens."""
    open_explorer(page, LONG_PROMPT)
    set_range(page, "#ex-run-length", 8)
    page.click("#ex-run")
    finished = wait_for_events(page, "generation.finished", 1)[-1]
    expect(page.locator("#ex-step")).to_be_enabled()
    stats, decode_steps = finished["stats"], [s for s in all_steps(page) if s["phase"] == "decode"]
    page.click('[data-inside="roofline"]')
    expect(page.locator("#inside-roofline")).to_be_visible()
    answer = page.evaluate(
        "async (id) => (await import('/static/js/api.js')).api('POST', `/api/generations/${id}/inspect/`,"
        " {view: 'roofline'})",
        finished["generation_id"],
    )
    # the timeline: the engine's queue and prefill times, then each decode step's recorded latency
    segments = page.locator("#rl-timeline .rl-seg").evaluate_all(
        "els => els.map(e => [e.dataset.phase, Number(e.dataset.ms), e.dataset.step])"
    )
    assert segments[:2] == [["queue", stats["queue_ms"], ""], ["prefill", stats["prefill_ms"], ""]]
    assert segments[2:] == [["decode", s["latency_ms"], str(s["index"])] for s in decode_steps]
    # FLOPs from the bundled model's shapes and this run's tokens, shown as the API computed them
    shape = architecture.shape_from_config(json.loads((bundled_dir() / "config.json").read_text()))
    prompt, cached = stats["num_prompt_tokens"], stats["num_cached_tokens"]
    prefill, decode, device = answer["prefill"], answer["decode"], answer["device"]
    assert prefill["flops"] == architecture.prefill_flops(shape, prompt, cached=cached, logits=1)
    assert decode["flops"] == sum(architecture.decode_flops(shape, prompt + s["index"])["as_run"] for s in decode_steps)
    assert decode["ms"] == pytest.approx(stats["decode_ms"])
    for phase, point in (("prefill", prefill), ("decode", decode)):
        assert shown(page, f'#rl-table [data-row="flops"] [data-phase="{phase}"]') == [
            fmt_si(page, point["flops"], "FLOP")
        ]
        assert shown(page, f'#rl-table [data-row="intensity"] [data-phase="{phase}"]') == [
            fmt_si(page, point["intensity"], "FLOP/byte")
        ]
        # the sentence says the side of the ridge the measured numbers put it on
        bound = "compute" if point["intensity"] >= device["ridge"] else "memory"
        sentence = page.locator(f'#rl-verdict [data-phase="{phase}"]')
        expect(sentence).to_have_attribute("data-bound", bound)
        expect(sentence).to_contain_text(
            "right of the ridge" if bound == "compute" else "left of the ridge", use_inner_text=True
        )
        expect(sentence).to_contain_text(fmt_si(page, point["intensity"], "FLOP/byte"))
    assert 0.4 < decode["intensity"] < 0.6  # float32 at batch 1: 2 FLOPs per 4-byte weight
    assert prefill["intensity"] > 10 * decode["intensity"]  # ~45 tokens share each weight read
    expect(page.locator("#rl-ridge")).to_have_text(fmt_si(page, device["ridge"], "FLOP/byte"))
    assert device["ridge"] == pytest.approx(device["matmul_flops_per_s"] / device["memory_bytes_per_s"])
    assert device["matmul_flops_per_s"] > 1e8 and device["memory_bytes_per_s"] > 1e8  # sanity, not speed
    roof, _, prefill_point, decode_point = chart_data(page, "roofline-chart")["datasets"]
    assert roof["data"][1] == pytest.approx({"x": device["ridge"], "y": device["matmul_flops_per_s"]})
    assert prefill_point["data"] == [{"x": prefill["intensity"], "y": prefill["achieved_flops_per_s"]}]
    assert decode_point["data"] == [{"x": decode["intensity"], "y": decode["achieved_flops_per_s"]}]
    page.locator("#ex-inside").screenshot(path=str(screenshot_dir / "inside-roofline.png"))


def bundled_dir() -> Path:
    return (
        Path(os.environ.get("PLAYGROUND_DATA_DIR") or Path(__file__).resolve().parents[2] / "data")
        / "models"
        / (BUNDLED_FOLDER_NAME)
    )
