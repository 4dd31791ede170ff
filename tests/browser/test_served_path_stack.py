"""The differential fuzz at the stack's level (issue 48; `python -m inference.bench fuzz` is the
engine's): one browser runs every lesson section while a second one opens the explorer's URL of
the reported bug after each, and step 0's distribution must be the very one it was before any
section ran (token and raw logprobs, bitwise through JSON): no-KV runs, beams, draws, grammars,
inspections and the DeepSeek demos' model switches leave nothing behind in the prefix cache, the
pool or the served weights."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .test_learn import SECTIONS, run_section
from .ui import events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# The URL of the report: "·is" at 98% once, "·Paris" every other time.
BUG_URL = "/explorer/?text=The capital of France is&temperature=1&top_k=0&top_p=1&min_p=0&seed=7"


def first_step(page) -> tuple:
    """Step 0 of the bug's URL as the explorer streams it: (token, [(id, raw logprob), ...])."""
    page.goto(BUG_URL)
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#ex-model option")).not_to_have_count(0)
    page.click("#ex-step")
    expect(page.locator(".step-tok")).to_have_count(1)
    step = next(s for e in events(page, "generation.tokens") for s in e["steps"])
    return step["token_id"], [(a["token_id"], a["logprob"]) for a in step["top_raw"]]


@pytest.mark.parametrize("lesson_page", ["en-US"], indirect=True)
def test_the_explorers_first_step_is_the_same_after_every_lesson_section(lesson_page, page, deepseek_demos):
    reference = first_step(page)
    assert len(reference[1]) >= 10
    lesson_page.goto("/learn/")
    expect(lesson_page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(lesson_page.locator("#learn-model")).not_to_be_empty()
    for section in SECTIONS:
        run_section(lesson_page, section)
        assert first_step(page) == reference, f"after the lesson's {section} section"
