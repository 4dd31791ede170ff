"""Constrained decoding in a real browser against the real server and worker (issue 50): the
explorer's grammar field (choices, a regular expression) sent as `overrides.grammar`, each step's
mask view showing the mass the grammar removed and the removed tokens the step lists, the answer
obeying the grammar, a path continued token by token under it (`prefix_ids`), a removed token
refused as a branch; the chat's settings send a grammar too; the lesson's "Constrained decoding"
section in both languages, its numbers the run's and no NaN/undefined."""

from __future__ import annotations

import math
import re

import pytest
from playwright.sync_api import expect

from .conftest import _new_page
from .test_explorer import all_steps, open_explorer
from .test_learn import BROKEN, check_constrained, run_section
from .ui import fmt_prob, sent_commands, set_range

pytestmark = [pytest.mark.browser, pytest.mark.e2e]


@pytest.fixture
def lesson_page(request, chromium, live_stack):
    """A page whose browser speaks `request.param`, the CSP enforced (as test_learn.py's)."""
    yield from _new_page(chromium, live_stack, bypass_csp=False, locale=request.param)


def fmt_mass(p: float) -> str:
    """Mirror of static/js/grammar.js fmtMass."""
    return f"{math.floor(p * 1000) / 10:.1f}%" if 0.995 <= p < 1 else fmt_prob(p)


def choose_grammar(page, kind: str, text: str, prefix: str = "ex") -> None:
    page.select_option(f"#{prefix}-grammar-kind", kind)
    page.fill(f"#{prefix}-grammar-text", text)


def wait_idle(page) -> None:
    expect(page.locator("#ex-stop")).to_be_hidden(timeout=180_000)


def test_a_choice_grammar_in_the_explorer_shows_its_mask_and_the_answer_is_a_choice(page, screenshot_dir):
    open_explorer(page, "Is Paris the capital of France? Answer yes or no.")
    page.check("#ex-chat")
    choose_grammar(page, "choice", "yes\nno")
    set_range(page, "#ex-run-length", 4)
    page.click("#ex-run")
    wait_idle(page)
    [command] = sent_commands(page, "complete")
    assert command["overrides"]["grammar"] == {"type": "choice", "choices": ["yes", "no"], "prefix_ids": []}
    steps = all_steps(page)
    text = "".join(s["text_delta"] for s in steps)
    assert text in ("yes", "no"), text
    assert all(0 <= s["masked_prob"] <= 1 for s in steps)
    # The first step: the model's chat answer would start with anything ("Yes", " Paris"...).
    page.locator(".step-tok").first.click()
    first = steps[0]
    view = page.locator("#ex-mask .mask-view")
    expect(view).to_be_visible()
    assert float(view.get_attribute("data-masked-prob")) == pytest.approx(first["masked_prob"])
    expect(view.locator(".mask-head")).to_contain_text(fmt_mass(first["masked_prob"]))
    removed = [a["token_id"] for a in first["top_masked"]]
    assert removed, "a chat model's first token is rarely a bare 'yes' or 'no'"
    shown = view.locator(".mask-tokens li").evaluate_all("els => els.map((e) => Number(e.dataset.tokenId))")
    assert shown == removed
    # In the table, the removed alternatives are marked; the processed column never lists them.
    marked = page.locator("#ex-alternatives-list .alt-row.masked").evaluate_all(
        "els => els.map((e) => Number(e.dataset.tokenId))"
    )
    assert marked == [a["token_id"] for a in first["top_raw"][:20] if a["token_id"] in set(removed)]
    assert not set(removed) & {a["token_id"] for a in first["top_processed"]}
    page.locator("#ex-mask").screenshot(path=str(screenshot_dir / "explorer-grammar-mask.png"))
    page.locator(".grammar-field").screenshot(path=str(screenshot_dir / "explorer-grammar-field.png"))
    # A removed token cannot be taken: the page says so and sends nothing.
    page.locator("#ex-alternatives-list .alt-row.masked").first.click()
    expect(page.locator("#ex-error")).to_be_visible()
    expect(page.locator("#ex-error")).to_contain_text("cannot take it")
    assert len(sent_commands(page, "complete")) == 1
    assert "NaN" not in page.locator("#ex-mask").inner_text() and "undefined" not in page.inner_text("main")


def test_a_regex_grammar_followed_token_by_token(page):
    open_explorer(page, "The year the first moon landing happened:")
    choose_grammar(page, "regex", " [0-9]{4}")
    for count in (1, 2, 3):
        page.click("#ex-step")
        expect(page.locator(".step-tok")).to_have_count(count, timeout=180_000)
        expect(page.locator("#ex-step")).to_be_enabled(timeout=180_000)
    commands = sent_commands(page, "complete")
    steps = all_steps(page)
    for i, command in enumerate(commands):
        # each request goes on from the path under the same grammar
        assert command["token_ids"] == [s["token_id"] for s in steps[:i]]
        assert command["overrides"]["grammar"] == {
            "type": "regex",
            "pattern": " [0-9]{4}",
            "prefix_ids": command["token_ids"],
        }
    text = "".join(s["text_delta"] for s in steps)
    assert re.fullmatch(r" [0-9]{0,4}", text), text  # a prefix of the pattern, however it was tokenized
    assert all(s["masked_prob"] is not None for s in steps)
    expect(page.locator("#ex-mask .mask-view")).to_be_visible()
    # A new grammar starts a new path.
    choose_grammar(page, "choice", "one\ntwo")
    expect(page.locator(".step-tok")).to_have_count(0)


def test_a_bad_regex_is_refused_with_the_field_named(page):
    open_explorer(page)
    choose_grammar(page, "regex", "(ab")
    page.click("#ex-step")
    expect(page.locator("#ex-error")).to_contain_text("grammar.pattern is not supported: unclosed group")
    expect(page.locator("#ex-error")).to_contain_text("invalid_params")


def test_the_chat_settings_send_a_grammar(page, screenshot_dir):
    page.goto("/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#model-select option")).not_to_have_count(0)
    page.evaluate("document.body.classList.add('show-settings')")  # the panel is off-canvas on narrow screens
    choose_grammar(page, "choice", "red\ngreen\nblue", prefix="ov")
    page.fill("#ov-max-tokens", "8")
    page.fill("#prompt-input", "Name a colour.")
    page.keyboard.press("Enter")
    finished = page.wait_for_function(
        "() => window.__events.find((e) => e.type === 'generation.finished' || e.type === 'generation.error')",
        timeout=180_000,
    ).json_value()
    page.locator("#settings").screenshot(path=str(screenshot_dir / "chat-grammar-settings.png"))
    [command] = sent_commands(page, "generate")
    assert command["overrides"]["grammar"] == {"type": "choice", "choices": ["red", "green", "blue"]}
    assert finished["type"] == "generation.finished" and finished["text"] in ("red", "green", "blue"), finished


@pytest.mark.parametrize("lesson_page", ["en-US", "zh-CN"], ids=["en", "zh-hans"], indirect=True)
def test_the_lesson_section_runs_a_schema_and_shows_the_mass_removed_per_step(lesson_page, screenshot_dir):
    page = lesson_page
    page.goto("/learn/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    language = "zh-hans" if "zh" in page.evaluate("navigator.language") else "en"
    expect(page.locator("#lc-title")).to_have_text("约束解码" if language == "zh-hans" else "Constrained decoding")
    check_constrained(page, run_section(page, "constrained"))
    shown = page.locator("#learn-constrained").inner_text()
    assert not BROKEN.findall(shown.replace(page.locator("#lc-result [data-kind=free] .learn-answer").inner_text(), ""))
    page.locator("#learn-constrained").screenshot(path=str(screenshot_dir / f"learn-constrained-{language}-run.png"))
