"""The surprise strip, the perplexities and the step export in a real browser, each number
checked against the engine's own values (the streamed step records, the worker's prompt
log-probabilities); and the small fixes around them (partial UTF-8 pieces, greedy
placeholders, the system prompt's placeholder, the empty KV chart)."""

from __future__ import annotations

import csv
import json
import math
import re
from typing import Any

import pytest
from playwright.sync_api import expect

from .test_chat import open_chat, open_details, send
from .test_explorer import all_steps, open_explorer
from .ui import events, set_range, steps_of_last_generation

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

LABEL = re.compile(r"surprise (-?[\d.]+) bits \(p [^)]*\) · entropy ([\d.]+) bits$")

# The worker's prompt log-probabilities, asked for directly (not through the strip's code).
PROMPT_LOGPROBS = """async (id) => {
  const { api } = await import("/static/js/api.js");
  return api("POST", `/api/generations/${id}/inspect/`, { view: "prompt_logprobs", top_n: 0 });
}"""


def expected_perplexity(logprobs: list[float | None]) -> float:
    known = [lp for lp in logprobs if lp is not None]
    return math.exp(-sum(known) / len(known))


def check_strip(strip, steps: list[dict[str, Any]]) -> None:
    """One cell per step whose numbers are the step's surprise (bits) and entropy (bits)."""
    cells = strip.locator(".strip-cell")
    expect(cells).to_have_count(len(steps))
    labels = cells.evaluate_all("(cells) => cells.map((c) => c.getAttribute('aria-label'))")
    heights = cells.evaluate_all("(cells) => cells.map((c) => Number(c.style.getPropertyValue('--surprise')))")
    for label, height, step in zip(labels, heights, steps):
        surprise, entropy = (float(x) for x in LABEL.search(label).groups())
        bits = -step["raw_logprob"] / math.log(2)
        assert surprise == pytest.approx(bits, abs=0.006)
        assert entropy == pytest.approx(step["entropy"] / math.log(2), abs=0.006)
        assert height == pytest.approx(min(bits / 8, 1), abs=0.001)
    shown = float(strip.locator(".answer-ppl b").inner_text())
    assert shown == pytest.approx(expected_perplexity([s["raw_logprob"] for s in steps]), abs=0.006)
    expect(strip.locator(".answer-ppl")).to_contain_text(f"over {len(steps)} token")


def check_prompt_perplexity(page, strip, generation_id: int, num_text_tokens: int) -> None:
    strip.locator(".prompt-ppl-btn").click()
    expect(strip.locator(".prompt-ppl")).to_be_visible()
    tokens = page.evaluate(PROMPT_LOGPROBS, generation_id)["tokens"][:num_text_tokens]
    assert tokens[0]["logprob"] is None  # nothing predicts the first token
    shown = float(strip.locator(".prompt-ppl b").inner_text())
    assert shown == pytest.approx(expected_perplexity([t["logprob"] for t in tokens]), rel=1e-3, abs=0.006)
    expect(strip.locator(".prompt-ppl")).to_contain_text(f"over {len(tokens) - 1} of {len(tokens)} tokens")


def test_chat_strip_perplexities_export_and_placeholders(page, screenshot_dir, tmp_path):
    open_chat(page, max_tokens=12)
    # The bundled template injects its own system prompt when the box is empty: say which.
    expect(page.locator("#system-prompt")).to_have_attribute(
        "placeholder", re.compile("You are a helpful AI assistant named SmolLM, trained by Hugging Face")
    )
    page.select_option("#preset-select", label="Greedy")
    # a temperature typed under a greedy preset makes it sample (SamplingParams.resolve_overrides): the
    # field says so; the others change nothing unless it is set, and then apply
    expect(page.locator("#ov-temperature")).to_have_attribute("placeholder", "greedy (type one to sample)")
    for field in ("#ov-top-k", "#ov-top-p", "#ov-seed"):
        expect(page.locator(field)).to_have_attribute("placeholder", "n/a (greedy)")
    page.fill("#ov-temperature", "0.7")
    expect(page.locator("#ov-top-k")).not_to_have_attribute("placeholder", "n/a (greedy)")
    page.fill("#ov-temperature", "")
    expect(page.locator("#ov-top-k")).to_have_attribute("placeholder", "n/a (greedy)")
    presets = {p["name"]: p for p in page.evaluate("fetch('/api/presets/').then((r) => r.json())")}
    expect(page.locator("#ov-max-tokens")).to_have_attribute(
        "placeholder", str(presets["Greedy"]["params"]["max_new_tokens"])
    )

    send(page, "Why is the sky blue?")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    steps = steps_of_last_generation(page)
    open_details(answer)  # the strip, the numbers and the exports are one click away
    strip = answer.locator(".surprise-strip")
    check_strip(strip, steps)
    expect(strip.locator(".strip-note")).to_be_visible()  # the explanation, once on the page
    generation_id = events(page, "generation.queued")[-1]["generation_id"]
    num_prompt_tokens = len(events(page, "generation.started")[-1]["prompt"]["tokens"])
    check_prompt_perplexity(page, strip, generation_id, num_prompt_tokens)
    strip.locator(".strip-cell").nth(1).hover()
    page.screenshot(path=str(screenshot_dir / "chat-strip.png"))

    # The download buttons: every stored step record, as CSV and as JSON.
    with page.expect_download() as download:
        answer.locator(".export-csv").click()
    assert download.value.suggested_filename == f"generation-{generation_id}-steps.csv"
    path = tmp_path / "steps.csv"
    download.value.save_as(path)
    rows = list(csv.DictReader(path.open(newline="", encoding="utf-8")))
    assert [int(r["token_id"]) for r in rows] == [s["token_id"] for s in steps]
    assert [float(r["raw_logprob"]) for r in rows] == pytest.approx([s["raw_logprob"] for s in steps])
    assert [json.loads(r["top_raw"]) for r in rows] == [s["top_raw"] for s in steps]
    href = answer.locator(".export-json").get_attribute("href")
    stored = page.request.get(href).json()["steps"]
    assert [s["token_id"] for s in stored] == [s["token_id"] for s in steps]

    # Reloaded, the stored answer draws the same strip once its steps load.
    page.reload()
    answer = page.locator(".msg-assistant").last
    open_details(answer)
    answer.locator(".strip-load").click()
    check_strip(answer.locator(".surprise-strip"), steps)


def test_explorer_strip_partial_utf8_greedy_sliders_and_kv_axis(page, screenshot_dir):
    open_explorer(page, "My parrot 🦜 says")
    # No step yet: the KV chart's axis labels whole bytes, none repeated.
    ticks = page.evaluate("Chart.getChart(document.getElementById('kv-chart')).scales.y.ticks.map((t) => t.label)")
    assert len(ticks) == len(set(ticks)) > 1, ticks
    # Temperature 0 is greedy: the filters after it say they are unused.
    set_range(page, "#ex-temperature", 0)
    for output in ("#ex-top-k-value", "#ex-top-p-value", "#ex-min-p-value"):
        expect(page.locator(output)).to_have_text("n/a (greedy)")
    set_range(page, "#ex-run-length", 6)
    page.click("#ex-run")
    expect(page.locator(".step-tok")).to_have_count(6)
    expect(page.locator("#ex-export")).to_be_visible()
    steps = all_steps(page)
    strip = page.locator("#ex-strip .surprise-strip")
    check_strip(strip, steps)
    generation_id = events(page, "generation.queued")[-1]["generation_id"]
    prompt_tokens = events(page, "generation.started")[-1]["prompt"]["tokens"]
    check_prompt_perplexity(page, strip, generation_id, len(prompt_tokens))
    expect(page.locator("#ex-export-csv")).to_have_attribute("href", f"/api/generations/{generation_id}/steps.csv")

    # The emoji's bytes are split over tokens that decode alone to U+FFFD: their chips show bytes.
    partial = [t for t in prompt_tokens if "\ufffd" in t["piece"]]
    assert partial, "the emoji should be split into byte pieces"
    chips = page.locator("#ex-tokenization .chip-piece").all_inner_texts()
    for token in partial:
        label = "<" + " ".join(f"0x{b:02X}" for b in bytes.fromhex(token["bytes"])) + ">"
        assert label in chips
    assert not any("\ufffd" in chip for chip in chips)
    # The token card of such a piece shows its bytes too.
    card_piece = page.evaluate("""async () => {
        const { stepDetails } = await import("/static/js/token_popover.js");
        const step = { piece: "\\ufffd", token_bytes: "e280", token_id: 1, raw_logprob: -1, logprob: -1, rank: 1,
                       entropy: 1, latency_ms: 1, phase: "decode", top_raw: [], top_processed: [] };
        return stepDetails(step).querySelector(".popover-head .piece").textContent;
    }""")
    assert card_piece == "<0xE2 0x80>"
    page.locator("#ex-strip").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_dir / "explorer-strip.png"))
