"""The explorer's "Inside this step" views and its exact processed column, in a real browser
against the real stack: the numbers shown against the engine's own (the step records the
worker streamed, a real rerun, the model info)."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

from inference.introspect import architecture
from inference.models.bundled import BUNDLED_FOLDER_NAME
from tests.conftest import run_prepare_step

from .test_explorer import all_steps, next_token, open_explorer
from .ui import chart_data, events, fmt_prob, set_range, steps_of_last_generation, visible_piece, wait_for_events

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


def test_at_temperature_1_without_filters_the_processed_column_is_the_streamed_raw_one(page):
    """Issue 24: the old recompute showed 76.3% beside the streamed 77.2% for the same token."""
    open_explorer(page)  # the explorer's defaults: temperature 1, top-k 0, top-p 1, min-p 0, penalty 1
    next_token(page, 1)
    step = all_steps(page)[-1]
    expect(page.locator("#ex-processed-head")).to_have_attribute("data-exact", "true")
    rows = page.locator("#ex-alternatives-list .alt-row:not(.alt-head)")
    expect(rows).to_have_count(len(step["top_raw"]))
    cells = rows.evaluate_all("(rs) => rs.map((r) => [...r.querySelectorAll('.num')].map((c) => c.textContent))")
    assert [raw for raw, _ in cells] == [fmt_prob(a["prob"]) for a in step["top_raw"]]
    assert [processed for _, processed in cells] == [raw for raw, _ in cells]
    processed = chart_data(page, "dist-chart")["datasets"][1]["data"]
    assert processed == [a["prob"] for a in step["top_raw"]][: len(processed)]  # the same numbers, not close ones
    assert step["logprob"] == step["raw_logprob"]  # the step was drawn from the raw distribution itself


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


CELLS = (
    "cells => cells.map((c) => [c.closest('.moe-layer').dataset.layer, c.closest('tr').dataset.step,"
    " c.dataset.expert, c.dataset.weight])"
)


def drawn_cells(page, root: str) -> set[tuple[int, int, int, float]]:
    """(layer, step, expert, weight) of every chosen cell under `root`."""
    cells = page.locator(f"{root} td.chosen").evaluate_all(CELLS)
    return {(int(layer), int(step), int(e), float(w)) for layer, step, e, w in cells}


def streamed_cells(steps: list[dict]) -> set[tuple[int, int, int, float]]:
    return {
        (c["layer"], s["index"], e, w)
        for s in steps
        for c in s["moe_routing"]
        for e, w in zip(c["experts"], c["weights"])
    }


def is_moe_answer(response) -> bool:
    return response.url.endswith("/inspect/") and response.request.post_data_json["view"] == "moe"


def test_moe_routing_of_the_demo_model(page, demo_model, screenshot_dir):
    open_explorer(page)
    moe_button = page.locator('[data-inside="moe"]')
    next_token(page, 1)  # the bundled model is dense: no experts to show
    assert events(page, "generation.started")[-1]["model"]["num_moe_layers"] == 0
    expect(moe_button).to_be_hidden()
    expect(page.locator("#ex-moe-live")).to_be_hidden()  # nor a live grid
    assert all(s["moe_routing"] is None for s in steps_of_last_generation(page))
    demo = page.locator("#ex-model option", has_text="DeepSeek-V3 architecture demo")
    page.select_option("#ex-model", demo.get_attribute("value"))
    expect(page.locator(".random-weights-notice")).to_be_visible()
    expect(page.locator(".random-weights-notice")).to_contain_text("Random weights")
    set_range(page, "#ex-run-length", 5)
    page.click("#ex-run")
    wait_for_events(page, "generation.finished", 2)
    expect(page.locator("#ex-step")).to_be_enabled()
    model = events(page, "generation.started")[-1]["model"]
    streamed = steps_of_last_generation(page)
    steps = [s["token_id"] for s in streamed]
    # the live grids, drawn from the steps as they arrived: every cell is a streamed record's
    expect(page.locator("#ex-moe-live .moe-layer")).to_have_count(model["num_moe_layers"])
    assert model["moe"]["layers"] == [c["layer"] for c in streamed[0]["moe_routing"]]
    assert drawn_cells(page, "#ex-moe-live") == streamed_cells(streamed)
    generation_id = events(page, "generation.queued")[-1]["generation_id"]
    stored = page.evaluate("(id) => fetch(`/api/generations/${id}/steps.json`).then((r) => r.json())", generation_id)
    assert [s["moe_routing"] for s in stored["steps"]] == [s["moe_routing"] for s in streamed]
    page.locator("#ex-moe-live").screenshot(path=str(screenshot_dir / "explorer-moe-live.png"))
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
    assert drawn_cells(page, "#inside-moe") == expected
    for token, step in zip(api["tokens"], streamed):  # teacher-forced = the generation's own passes
        for inspected, live in zip(token["layers"], step["moe_routing"]):
            assert inspected["experts"] == live["experts"]
            assert inspected["weights"] == pytest.approx(live["weights"], abs=1e-5 + 1e-9)
    for index, layer in enumerate(layers):
        load = page.locator(f'#inside-moe .moe-layer[data-layer="{layer}"] tr.moe-load td').evaluate_all(
            "cells => cells.map((c) => Number(c.dataset.load))"
        )
        chosen = [e for t in api["tokens"] for e in t["layers"][index]["experts"]]
        assert load == [chosen.count(e) for e in range(api["n_routed_experts"])]
    first = api["tokens"][0]["layers"][0]
    cell = page.locator(
        f'#inside-moe .moe-layer[data-layer="{layers[0]}"] tr[data-step="0"] td[data-expert="{first["experts"][0]}"]'
    )
    expect(cell).to_have_attribute(
        "title", re.compile(rf"layer {layers[0] + 1} · expert {first['experts'][0]}: weight")
    )
    page.locator("#ex-inside").screenshot(path=str(screenshot_dir / "inside-moe.png"))


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
    # the device's time: the decode steps' passes, within the stream's wall time from its first token
    assert decode["ms"] == pytest.approx(sum(s["latency_ms"] for s in decode_steps))
    assert decode["ms"] <= stats["decode_ms"]
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
    # no point above its roof: a phase that beat a measured roof raised it, and the line says so
    assert prefill["fraction_of_roof"] <= 1 + 1e-9 and decode["fraction_of_roof"] <= 1 + 1e-9
    raised = page.evaluate(
        """async (device) => (await import('/static/js/roofline.js')).deviceLine({ ...device,
             raised_by: { matmul_flops_per_s: 'prefill' }, measured_matmul_flops_per_s: 4e10 }).textContent""",
        device,
    )
    assert "reached by this request's prefill; the" in raised and fmt_si(page, 4e10, "FLOP/s") in raised
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


def test_one_step_under_two_precisions(page, screenshot_dir):
    """The served float32 weights beside the bundled model's int8 (loaded beside it on the worker):
    the numbers shown are the worker's, the served side is the step's own streamed distribution."""
    open_explorer(page)
    set_range(page, "#ex-run-length", 4)
    page.click("#ex-run")
    finished = wait_for_events(page, "generation.finished", 1)[-1]
    expect(page.locator("#ex-step")).to_be_enabled()
    steps = all_steps(page)
    page.click('[data-inside="precision"]')
    expect(page.locator("#inside-precision")).to_be_visible(timeout=180_000)
    expect(page.locator("#precision-other")).to_have_value("int8")
    answer = page.evaluate(
        "async (id) => (await import('/static/js/api.js')).api('POST', `/api/generations/${id}/inspect/`,"
        " {view: 'precision', precision: 'int8'})",
        finished["generation_id"],
    )
    assert (answer["served_precision"], answer["other_precision"]) == ("float32", "int8")
    assert [s["token_id"] for s in answer["steps"]] == [s["token_id"] for s in steps]
    for step, streamed in zip(answer["steps"], steps):
        assert step["served"]["top"][0]["token_id"] == streamed["top_raw"][0]["token_id"]
        assert 0 < step["kl"] < 0.5
    expect(page.locator("#precision-mean-kl")).to_have_text(f"{answer['mean_kl']:.2e}".replace("e-0", "e-"))
    assert page.locator("#inside-precision .prob-strip span").count() == len(steps)
    shown = page.locator("#precision-table tbody tr").first.locator("td").all_inner_texts()
    assert shown[1] == visible_piece(answer["steps"][-1]["served"]["top"][0]["piece"])
    page.screenshot(path=str(screenshot_dir / "inside-precision.png"), full_page=True)
