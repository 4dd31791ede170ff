"""The explorer's "Inside this step" views and its exact processed column, in a real browser
against the real stack: the numbers shown against the engine's own (the step records the
worker streamed, a real rerun, the model info)."""

from __future__ import annotations

import math

import pytest
from playwright.sync_api import expect

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
