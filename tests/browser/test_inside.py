"""The explorer's "Inside this step" views and its exact processed column, in a real browser
against the real stack: the numbers shown against the engine's own (the step records the
worker streamed, a real rerun, the model info)."""

from __future__ import annotations

import math
import re
import sys

import pytest
from playwright.sync_api import expect

from tests.conftest import run_prepare_step

from .test_explorer import all_steps, next_token, open_explorer
from .ui import chart_data, events, set_range, steps_of_last_generation, visible_piece, wait_for_events

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


@pytest.fixture(scope="module")
def demo_model(live_stack, tmp_path_factory) -> None:
    """The random-weights DeepSeek-V3 demo, built by `manage.py demo_model` into a temporary
    folder (not the shared data dir) and registered in the stack's database."""
    out_dir = tmp_path_factory.mktemp("demo") / "deepseek-v3-demo-random"
    argv = [sys.executable, "-m", "django", "demo_model", "--out-dir", str(out_dir)]
    run_prepare_step("demo-model", argv, live_stack.env)


def is_moe_answer(response) -> bool:
    return response.url.endswith("/inspect/") and response.request.post_data_json["view"] == "moe"


def test_moe_routing_of_the_demo_model(page, demo_model, screenshot_dir):
    open_explorer(page)
    moe_button = page.locator('[data-inside="moe"]')
    next_token(page, 1)  # the bundled model is dense: no experts to show
    assert events(page, "generation.started")[-1]["model"]["num_moe_layers"] == 0
    expect(moe_button).to_be_hidden()
    demo = page.locator("#ex-model option", has_text="random weights")
    page.select_option("#ex-model", demo.get_attribute("value"))
    expect(page.locator(".random-weights-notice")).to_be_visible()
    expect(page.locator(".random-weights-notice")).to_contain_text("Random weights")
    set_range(page, "#ex-run-length", 5)
    page.click("#ex-run")
    wait_for_events(page, "generation.finished", 2)
    expect(page.locator("#ex-step")).to_be_enabled()
    model = events(page, "generation.started")[-1]["model"]
    steps = [s["token_id"] for s in steps_of_last_generation(page)]
    with page.expect_response(is_moe_answer) as response:
        moe_button.click()
    api = response.value.json()
    expect(page.locator("#inside-moe .moe-layer")).to_have_count(model["num_moe_layers"])
    assert [t["sampled_token_id"] for t in api["tokens"]] == steps  # the streamed steps, in order
    scale, layers = api["routed_scaling_factor"], api["layers"]
    expected = set()
    for token in api["tokens"]:
        for layer, choice in zip(layers, token["layers"]):
            assert sum(choice["weights"]) == pytest.approx(scale, abs=1e-3) and len(choice["groups"]) <= 2
            expected |= {(layer, token["step"], e, w) for e, w in zip(choice["experts"], choice["weights"])}
    drawn = page.locator("#inside-moe td.chosen").evaluate_all(
        "cells => cells.map((c) => [c.closest('.moe-layer').dataset.layer, c.closest('tr').dataset.step,"
        " c.dataset.expert, c.dataset.weight])"
    )
    assert {(int(layer), int(step), int(e), float(w)) for layer, step, e, w in drawn} == expected
    for index, layer in enumerate(layers):
        load = page.locator(f'.moe-layer[data-layer="{layer}"] tr.moe-load td').evaluate_all(
            "cells => cells.map((c) => Number(c.dataset.load))"
        )
        chosen = [e for t in api["tokens"] for e in t["layers"][index]["experts"]]
        assert load == [chosen.count(e) for e in range(api["n_routed_experts"])]
    first = api["tokens"][0]["layers"][0]
    cell = page.locator(
        f'.moe-layer[data-layer="{layers[0]}"] tr[data-step="0"] td[data-expert="{first["experts"][0]}"]'
    )
    expect(cell).to_have_attribute(
        "title", re.compile(rf"layer {layers[0] + 1} · expert {first['experts'][0]}: weight")
    )
    page.locator("#ex-inside").screenshot(path=str(screenshot_dir / "inside-moe.png"))
