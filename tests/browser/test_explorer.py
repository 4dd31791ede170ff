"""The token-probability explorer in a real browser against the real server and worker:
stepping, the charts' data, client-side processors vs the engine's, branching, beams."""

from __future__ import annotations

import math
import re

import pytest
from playwright.sync_api import expect

from .ui import chart_data, events, fmt_prob, sent_commands, set_range, visible_piece, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

PROMPT = "The capital of France is"


def open_explorer(page, text: str = PROMPT) -> None:
    page.goto("/explorer/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#ex-model option")).not_to_have_count(0)
    page.fill("#ex-text", text)
    page.fill("#ex-seed", "3")


def next_token(page, expected_count: int) -> None:
    page.click("#ex-step")
    expect(page.locator(".step-tok")).to_have_count(expected_count)
    expect(page.locator("#ex-step")).to_be_enabled()


def all_steps(page) -> list[dict]:
    return [step for e in events(page, "generation.tokens") for step in e["steps"]]


def test_step_three_tokens_then_branch(page, screenshot_dir):
    open_explorer(page)
    for count in (1, 2, 3):
        next_token(page, count)
    steps = all_steps(page)
    assert len(steps) == 3
    assert [s["index"] for s in steps] == [0, 0, 0]  # one request per step

    # The distribution chart shows the last step's raw top tokens.
    dist = chart_data(page, "dist-chart")
    assert dist["labels"] == [visible_piece(a["piece"]) for a in steps[-1]["top_raw"][:20]]
    assert dist["datasets"][0]["data"] == pytest.approx([a["prob"] for a in steps[-1]["top_raw"][:20]])
    expect(page.locator("#ex-step-label")).to_have_text("step 2 · prefill")

    # The charts over the generation have one point per step, prefill coloured as such.
    prob = chart_data(page, "prob-chart")
    assert prob["labels"] == ["0", "1", "2"]
    assert prob["datasets"][0]["data"] == pytest.approx([math.exp(s["raw_logprob"]) for s in steps])
    assert chart_data(page, "entropy-chart")["datasets"][0]["data"] == pytest.approx([s["entropy"] for s in steps])
    latency = chart_data(page, "latency-chart")["datasets"][0]
    assert latency["data"] == pytest.approx([s["latency_ms"] for s in steps])
    assert len(set(latency["backgroundColor"])) == 1  # every step was a fresh request's prefill
    kv = chart_data(page, "kv-chart")["datasets"][0]["data"]
    assert kv == sorted(kv) and kv[0] > 0

    # The pipeline strip, from generation.started's model; each step here was a prefill.
    started = events(page, "generation.started")[-1]
    model = started["model"]
    pipeline = page.locator("#ex-pipeline")
    expect(pipeline.locator('[data-stage="layers"]')).to_contain_text(f"{model['num_layers']} transformer layers")
    expect(pipeline.locator('[data-stage="embeddings"]')).to_contain_text(f"{model['hidden_size']}-d")
    expect(pipeline.locator('[data-stage="logits"]')).to_contain_text(f"{model['vocab_size']:,} vocab")
    expect(pipeline.locator(".pipe-phase-prefill")).to_have_class(re.compile(r"\bactive\b"))
    expect(pipeline.locator(".pipe-phase-decode")).not_to_have_class(re.compile(r"\bactive\b"))

    # The caches were on, and each step's prompt extends the previous one: the prefix cache
    # served the later steps, and its counters (after the last request) are shown.
    overrides = sent_commands(page, "complete")[-1]["overrides"]
    assert overrides["use_kv_cache"] is True and overrides["use_prefix_cache"] is True
    # The sliders are the whole setting, though the default chat preset is greedy: the engine
    # sampled (greedy would have drawn every token with processed probability 1).
    assert overrides["greedy"] is False
    assert any(math.exp(s["logprob"]) < 1 - 1e-6 for s in steps)
    prefilled = events(page, "generation.prefilled")
    assert prefilled[-1]["num_cached_tokens"] > 0
    expect(page.locator("#ex-cache-label")).to_contain_text(
        f"{prefilled[-1]['num_prompt_tokens']} prompt · {prefilled[-1]['num_cached_tokens']} cached · "
        f"{prefilled[-1]['num_prefilled_tokens']} prefilled · prefill"
    )
    counters = events(page, "generation.finished")[-1]["stats"]["prefix_cache"]
    assert counters["hits"] >= 2
    expect(page.locator("#ex-serving .prefix-cache")).to_contain_text(f"{counters['hits']:,} hits")
    expect(page.locator("#ex-serving .colocated")).to_contain_text(started["worker"])

    # The tokenization of the prompt, from generation.started.
    expect(page.locator("#ex-tokenization .chip")).to_have_count(len(started["prompt"]["tokens"]))
    expect(page.locator("#ex-continuation")).to_contain_text(PROMPT + "".join(s["piece"] for s in steps))
    page.screenshot(path=str(screenshot_dir / "explorer.png"), full_page=True)

    # Branch: at step 1 take the most likely token that was not chosen, and continue.
    page.locator('.step-tok[data-step="1"]').click()
    expect(page.locator("#ex-step-label")).to_have_text("step 1 · prefill")
    alternative = next(a for a in steps[1]["top_raw"] if a["token_id"] != steps[1]["token_id"])
    page.locator(f'#ex-alternatives-list button[data-token-id="{alternative["token_id"]}"]').click()
    wait_for_events(page, "generation.finished", 4)
    expect(page.locator(".step-tok")).to_have_count(3)
    branched = page.locator('.step-tok[data-step="1"]')
    expect(branched).to_have_attribute("data-token-id", str(alternative["token_id"]))
    expect(branched).to_have_class("step-tok branched")
    new_step = all_steps(page)[-1]
    expected_text = PROMPT + steps[0]["piece"] + alternative["piece"] + new_step["piece"]
    expect(page.locator("#ex-continuation")).to_have_text(expected_text)


def test_sliders_recompute_the_processed_distribution_like_the_engine(page):
    open_explorer(page)
    set_range(page, "#ex-temperature", 0.7)
    set_range(page, "#ex-top-k", 5)
    expect(page.locator("#ex-top-k-value")).to_have_text("5")
    next_token(page, 1)
    step = all_steps(page)[-1]
    assert len(step["top_processed"]) >= 5

    # Top-k 5 keeps tokens the step already lists, so renormalizing over them is exact.
    processed = chart_data(page, "dist-chart")["datasets"][1]["data"]
    engine = {a["token_id"]: a["prob"] for a in step["top_processed"]}
    for alt, prob in zip(step["top_raw"][:20], processed):
        assert prob == pytest.approx(engine.get(alt["token_id"], 0.0), abs=2e-3)

    # Moving a slider redraws the current step at once, without a request.
    num_requests = len(events(page, "generation.queued"))
    set_range(page, "#ex-top-k", 1)
    processed = chart_data(page, "dist-chart")["datasets"][1]["data"]
    assert processed[0] == pytest.approx(1.0) and sum(processed[1:]) == pytest.approx(0.0)
    # Temperature 2 spreads probability over the unlisted tail: renormalizing over the listed
    # tokens would be far off (37% where the truth is 5%), so nothing is drawn until the worker's
    # exact answer comes.
    set_range(page, "#ex-top-k", 0)
    set_range(page, "#ex-temperature", 2)
    head = page.locator("#ex-processed-head")
    assert head.inner_text() == "computing exact…"
    assert chart_data(page, "dist-chart")["datasets"][1]["data"] == [None] * len(step["top_raw"][:20])
    expect(page.locator("#ex-alternatives-list .processed").first).to_have_text("…")
    expect(head).to_have_attribute("data-exact", "true")
    expect(head).to_have_text("processed")
    hot = chart_data(page, "dist-chart")["datasets"][1]["data"]
    assert hot[0] < step["top_raw"][0]["prob"]  # flatter than the raw distribution, from the worker
    set_range(page, "#ex-temperature", 0)
    expect(page.locator("#ex-temperature-value")).to_have_text("0 · greedy")
    # Greedy draws nothing: all of the probability on the top token, drawn at once (the worker's
    # exact answer says the same), as the A/B page has it.
    processed = chart_data(page, "dist-chart")["datasets"][1]["data"]
    assert processed == [1.0] + [0.0] * (len(processed) - 1)
    expect(head).to_have_attribute("data-exact", "true")
    assert len(events(page, "generation.queued")) == num_requests  # inspections are not generations

    # The repetition penalty (the API's) has a slider: the browser cannot apply it (it needs the
    # raw scores), so the worker computes it; the next request sends it.
    set_range(page, "#ex-repetition-penalty", 1.3)
    expect(page.locator("#ex-repetition-penalty-value")).to_have_text("1.30")
    assert head.inner_text() == "computing exact…"
    expect(head).to_have_attribute("data-exact", "true")
    # Counting the continuation's tokens only is another distribution: recomputed too, then sent.
    page.uncheck("#ex-penalize-prompt")
    expect(head).to_have_attribute("data-exact", "true")
    next_token(page, 2)
    sent = sent_commands(page, "complete")[-1]["overrides"]
    assert (sent["repetition_penalty"], sent["penalize_prompt"]) == (1.3, False)


def test_newline_tokens_are_wide_enough_to_click_and_greedy_draws_with_probability_one(page):
    open_explorer(page, "Three fruits, one per line:\n1. Apple\n2.")  # the text of the check below
    set_range(page, "#ex-temperature", 0)
    set_range(page, "#ex-run-length", 12)
    page.click("#ex-run")
    finished = wait_for_events(page, "generation.finished")[-1]
    expect(page.locator(".step-tok")).to_have_count(finished["stats"]["num_generated_tokens"])
    steps = all_steps(page)
    with_newline = [s["index"] for s in steps if "\n" in s["piece"]]
    assert with_newline, f"the model wrote no line break: {[s['piece'] for s in steps]}"
    for index in with_newline:
        token = page.locator(f'.step-tok[data-step="{index}"]')
        box = token.bounding_box()
        assert box and box["width"] >= 4, f"step {index}'s newline token is {box}"
        token.click()
        expect(page.locator("#ex-step-label")).to_have_text(re.compile(f"^step {index} "))
    # The text is still the model's: the ↵ is drawn by CSS.
    text = "Three fruits, one per line:\n1. Apple\n2."
    expect(page.locator("#ex-continuation")).to_have_text(text + "".join(s["piece"] for s in steps))
    # Greedy took each token with probability 1 (the raw one is the model's).
    expect(page.locator("#ex-step-info")).to_contain_text("sampled p 100%")
    assert chart_data(page, "prob-chart")["datasets"][1]["data"] == [1.0] * len(steps)
    # These settings drew the steps: their processed column is known at once, all on the token.
    head = page.locator("#ex-processed-head")
    expect(head).to_have_attribute("data-exact", "true")
    processed = chart_data(page, "dist-chart")["datasets"][1]["data"]
    assert processed.count(1.0) == 1 and sum(processed) == 1.0


def test_run_and_beam_search_tree(page, screenshot_dir):
    open_explorer(page, "Once upon a time")
    set_range(page, "#ex-run-length", 4)
    page.click("#ex-run")
    finished = wait_for_events(page, "generation.finished", 1)[-1]
    expect(page.locator(".step-tok")).to_have_count(finished["stats"]["num_generated_tokens"])
    phases = [s["phase"] for s in all_steps(page)]
    assert phases[0] == "prefill" and set(phases[1:]) <= {"decode"}
    colours = chart_data(page, "latency-chart")["datasets"][0]["backgroundColor"]
    assert len(phases) < 2 or colours[0] != colours[1]  # prefill is told apart from decode

    page.select_option("#ex-beams", "2")
    expect(page.locator("#ex-step")).to_be_disabled()
    page.click("#ex-run")
    beam_finished = wait_for_events(page, "generation.finished", 2)[-1]
    beam_steps = [s for e in events(page, "generation.beams") for s in e["steps"]]
    assert beam_steps, "beam search sent no generation.beams"
    tree = page.locator("#ex-beam-tree svg")
    expect(tree.locator("g.node:not(.root)")).to_have_count(sum(len(s["beams"]) for s in beam_steps))
    if beam_finished["stats"].get("sequences"):
        assert tree.locator("g.node.best").count() >= 1
        expect(page.locator("#ex-beam-results")).to_contain_text(beam_finished["stats"]["sequences"][0]["text"])

    # Beam search has no chosen token per step: its own charts, from the streamed beam steps.
    expect(page.locator("#ex-gen-charts")).to_be_hidden()
    expect(page.locator("#ex-gen-beam-note")).to_be_visible()
    live = [[b for b in s["beams"] if not b["is_finished"]] for s in beam_steps]
    best_scores = [(beams or s["beams"])[0]["score"] for beams, s in zip(live, beam_steps)]
    assert all(not beams or beams[0]["score"] == max(b["score"] for b in beams) for beams in live)
    score = chart_data(page, "beam-score-chart")
    assert score["labels"] == [str(s["index"]) for s in beam_steps]
    assert score["datasets"][0]["data"] == pytest.approx(best_scores)
    counts = chart_data(page, "beam-count-chart")["datasets"]
    assert counts[0]["data"] == [len(beams) for beams in live]
    assert counts[1]["data"] == [len(s["beams"]) - len(beams) for beams, s in zip(live, beam_steps)]
    latency = chart_data(page, "beam-latency-chart")["datasets"][0]["data"]
    assert latency == pytest.approx([s["latency_ms"] for s in beam_steps])
    page.locator("#ex-beam-section").screenshot(path=str(screenshot_dir / "explorer-beams.png"))


def test_flat_first_token_distribution_is_explained(page, screenshot_dir):
    open_explorer(page, "What is the capital of France?")
    page.check("#ex-chat")
    next_token(page, 1)
    step = all_steps(page)[-1]
    top = step["top_raw"]
    assert top[0]["prob"] < 0.3, f"the model's first token is not flat here: {top[:3]}"
    note = page.locator("#ex-flat-note")
    expect(note).to_be_visible()
    assert note.locator(".note-prob").all_inner_texts() == [fmt_prob(a["prob"]) for a in top[:4]]
    assert note.locator(".piece").first.inner_text() == f"“{visible_piece(top[0]['piece'])}”"
    expect(note).to_contain_text(f"entropy {step['entropy']:.2f} nats")
    # With the worker's exact processed distribution (sliders at their neutral values: the raw
    # one), "something other than the top token" is 1 - its probability.
    expect(page.locator("#ex-processed-head")).to_have_attribute("data-exact", "true")
    expect(note.locator(".note-others")).to_have_text(fmt_prob(1 - top[0]["prob"]))
    page.locator("#ex-dist-title").locator("xpath=../..").screenshot(path=str(screenshot_dir / "explorer-flat.png"))

    # A clear favourite gets no note.
    page.click("#ex-reset")
    page.uncheck("#ex-chat")
    page.fill("#ex-text", "One, two, three, four, five, six, seven,")
    next_token(page, 1)
    assert all_steps(page)[-1]["top_raw"][0]["prob"] >= 0.3
    expect(note).to_have_count(0)


def test_cache_switches_change_the_request(page, screenshot_dir):
    open_explorer(page, "Once upon a time")
    page.uncheck("#ex-kv-cache")
    page.uncheck("#ex-prefix-cache")
    set_range(page, "#ex-run-length", 3)
    page.click("#ex-run")
    finished = wait_for_events(page, "generation.finished", 1)[-1]
    expect(page.locator(".step-tok")).to_have_count(finished["stats"]["num_generated_tokens"])

    command = sent_commands(page, "complete")[-1]
    assert command["overrides"]["use_kv_cache"] is False
    assert command["overrides"]["use_prefix_cache"] is False
    assert "pd" not in command  # PD off: the server's mode decides

    # No KV cache: nothing is kept between steps, and nothing was served from the prefix cache.
    kv = chart_data(page, "kv-chart")["datasets"][0]["data"]
    assert kv and all(value == 0 for value in kv)
    expect(page.locator("#ex-cache-label")).to_contain_text(" 0 cached")
    if finished["stats"]["num_generated_tokens"] > 1:  # the last step decoded: the strip says so
        expect(page.locator("#ex-pipeline .pipe-phase-decode")).to_have_class(re.compile(r"\bactive\b"))
        expect(page.locator('#ex-pipeline [data-stage="layers"]')).to_contain_text("1 token / pass")
    page.locator(".toggle-list").scroll_into_view_if_needed()
    page.locator(".explorer-controls").screenshot(path=str(screenshot_dir / "explorer-request.png"))
