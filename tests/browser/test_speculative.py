"""Speculative decoding on the pages (issue 51), in a real browser against the live stack: the lesson's
section runs the same code edit without and with prompt lookup and shows the two answers identical
with a nonzero acceptance; the explorer sends its speculation control as overrides and marks the
tokens that came out of a verification pass; the chat shows an answer's acceptance and speedup."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .ui import events, sent_commands, set_range, steps_of_last_generation, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# A text whose continuation repeats what came before it: prompt lookup finds its next tokens there.
COPYING_TEXT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"


def finished_runs(page) -> list[dict]:
    """Each finished generation's steps and finished event, oldest first."""
    finished = events(page, "generation.finished")
    tokens = events(page, "generation.tokens")
    return [
        {"steps": [s for e in tokens if e["generation_id"] == f["generation_id"] for s in e["steps"]], "finished": f}
        for f in finished
    ]


def test_the_lesson_runs_the_same_answer_without_and_with_prompt_lookup(page, screenshot_dir):
    page.goto("/learn/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    section = page.locator("#learn-speculative")
    page.select_option("#lsd-tokens", "48")
    page.click("#lsd-run")
    expect(section).not_to_have_attribute("data-state", "running", timeout=180_000)
    assert section.get_attribute("data-state") == "done", section.inner_text()[-1500:]

    commands = sent_commands(page, "complete")[-2:]
    assert [c["overrides"]["speculative"] for c in commands] == ["off", "prompt_lookup"]
    assert all(c["overrides"]["greedy"] and c["overrides"]["max_new_tokens"] == 48 for c in commands)
    plain, spec = finished_runs(page)[-2:]
    assert [s["token_id"] for s in plain["steps"]] == [s["token_id"] for s in spec["steps"]]
    assert plain["finished"]["text"] == spec["finished"]["text"]
    stats = spec["finished"]["stats"]
    assert stats["num_accepted_tokens"] > 0, stats
    assert plain["finished"]["stats"]["num_proposed_tokens"] == 0

    expect(section.locator(".learn-same")).to_have_attribute("data-same", "true")
    numbers = dict(
        section.locator("[data-measure]").evaluate_all("els => els.map((e) => [e.dataset.measure, e.dataset.value])")
    )
    assert float(numbers["same_text"]) == 1
    assert int(numbers["num_accepted_tokens"]) == stats["num_accepted_tokens"]
    rate = stats["num_accepted_tokens"] / stats["num_proposed_tokens"]
    assert float(numbers["acceptance_rate"]) == pytest.approx(rate)
    assert float(numbers["estimated_speedup"]) == pytest.approx(stats["speculative_speedup"])
    assert float(numbers["plain_decode_ms"]) == pytest.approx(plain["finished"]["stats"]["decode_ms"])
    assert float(numbers["spec_decode_ms"]) == pytest.approx(stats["decode_ms"])
    assert float(numbers["tokens_per_pass"]) > 1
    # the strip: one box per decode pass, accepted tokens green, the first rejections red
    verified = [s for s in spec["steps"] if s.get("verification")]
    assert verified
    expect(section.locator(".spec-pass.verified").first).to_be_visible()
    num_accepted = sum(1 for s in verified if s["verification"]["position"] < s["verification"]["num_accepted"])
    expect(section.locator(".spec-strip .spec-tok.spec-accepted")).to_have_count(num_accepted)
    assert "speculative=prompt_lookup" in section.locator("#lsd-link").get_attribute("href")
    section.screenshot(path=str(screenshot_dir / "learn-speculative-en.png"))


def test_the_explorer_marks_the_tokens_a_verification_pass_accepted(page, screenshot_dir):
    page.goto("/explorer/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#ex-model option")).not_to_have_count(0)
    page.fill("#ex-text", COPYING_TEXT)
    set_range(page, "#ex-temperature", 0)
    set_range(page, "#ex-run-length", 16)
    page.select_option("#ex-speculative", "prompt_lookup")
    expect(page.locator("#ex-prediction-field")).to_be_hidden()
    page.click("#ex-run")
    wait_for_events(page, "generation.finished")
    expect(page.locator("#ex-run")).to_be_visible()

    (command,) = sent_commands(page, "complete")
    assert command["overrides"]["speculative"] == "prompt_lookup"
    assert "num_speculative_tokens" not in command["overrides"]  # k empty: chosen per pass
    steps = steps_of_last_generation(page)
    accepted = [s for s in steps if (v := s.get("verification")) and v["position"] < v["num_accepted"]]
    assert accepted, [s.get("verification") for s in steps]
    marked = page.locator("#ex-continuation .step-tok.spec-accepted")
    expect(marked).to_have_count(len(accepted))
    expect(page.locator("#ex-spec")).to_be_visible()
    expect(page.locator("#ex-spec .spec-pass.verified").first).to_be_visible()
    expect(page.locator("#ex-spec .spec-legend")).to_be_visible()
    summary = page.locator("#ex-spec-summary")
    assert float(summary.get_attribute("data-tokens-per-pass")) > 1

    # the selected token's pass: the proposals, the accepted ones marked, both probabilities
    step = accepted[0]
    marked.first.click()
    view = page.locator("#ex-verify .spec-view")
    expect(view).to_be_visible()
    v = step["verification"]
    expect(view.locator(".spec-prop")).to_have_count(len(v["proposed"]))
    expect(view.locator(".spec-prop.spec-accepted")).to_have_count(v["num_accepted"])
    expect(view.locator(".spec-prop.spec-rejected")).to_have_count(1 if v["num_accepted"] < len(v["proposed"]) else 0)
    expect(view).to_contain_text("prompt lookup")
    view.screenshot(path=str(screenshot_dir / "explorer-verification.png"))
    page.locator("#ex-spec").screenshot(path=str(screenshot_dir / "explorer-speculative.png"))

    # a prediction is sent as such, with k when it is set
    page.click("#ex-reset")
    page.select_option("#ex-speculative", "prediction")
    expect(page.locator("#ex-prediction-field")).to_be_visible()
    page.fill("#ex-prediction", " 4, 5, 6, 7, 8, 9, 10")
    page.fill("#ex-spec-k", "4")
    set_range(page, "#ex-run-length", 4)
    page.click("#ex-run")
    wait_for_events(page, "generation.finished", 2)
    overrides = sent_commands(page, "complete")[-1]["overrides"]
    assert overrides["prediction"] == " 4, 5, 6, 7, 8, 9, 10" and overrides["num_speculative_tokens"] == 4
    assert "speculative" not in overrides


def test_chat_shows_an_answers_acceptance_and_speedup(page):
    page.goto("/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#preset-select option")).not_to_have_count(0)
    page.fill("#ov-max-tokens", "24")
    page.select_option("#ov-speculative", "prompt_lookup")
    page.fill("#prompt-input", f"Repeat this list exactly: {COPYING_TEXT}")
    page.press("#prompt-input", "Enter")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    (command,) = sent_commands(page, "generate")
    assert command["overrides"]["speculative"] == "prompt_lookup"
    stats = wait_for_events(page, "generation.finished")[-1]["stats"]
    assert stats["num_proposed_tokens"] > 0, stats
    accepted, proposed = stats["num_accepted_tokens"], stats["num_proposed_tokens"]
    line = answer.locator(".spec-stats")
    expect(line).to_contain_text(f"accepted ({accepted}/{proposed})")
    expect(line).to_contain_text(f"≈{stats['speculative_speedup']:.2f}× faster")
    answer.locator(".details-btn").click()
    expect(answer.locator(".msg-stats .spec-acceptance")).to_contain_text(f"({accepted}/{proposed})")
    expect(answer.locator(".msg-stats .spec-speedup")).to_be_visible()
    # the setting is not kept by Reset
    page.click("#reset-overrides")
    expect(page.locator("#ov-speculative")).to_have_value("off")
