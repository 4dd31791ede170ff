"""The architecture card page in a real browser: it opens on the default model (not the first
name in the list), prints no absent part as "null", writes units as the rest of the site does,
uses the site's controls, and a quick change of model then dtype renders the last choice once."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import django_shell

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# Every text node of the card that reads exactly "null" (replaceChildren writes null as that text).
NULL_TEXT = """() => {
  const walker = document.createTreeWalker(document.getElementById('arch-card'), NodeFilter.SHOW_TEXT);
  const found = [];
  while (walker.nextNode()) {
    if (walker.currentNode.data.trim() === 'null') found.push(walker.currentNode.parentNode.outerHTML.slice(0, 80));
  }
  return found;
}"""

# The card's request for a model with no dtype answers 1.5 s late: a stale answer arriving after
# a newer one must not replace it.
SLOW_FIRST = r"""
const nativeFetch = window.fetch;
window.fetch = async (url, ...rest) => {
  const isLate = /architectures?\/.*\?context=/.test(String(url)) && !String(url).includes("dtype=");
  if (isLate) await new Promise((r) => setTimeout(r, 1500));
  return nativeFetch(url, ...rest);
};
"""


def settled(page, query: str) -> None:
    """Wait until the card shows `query` (the page marks what it shows once rendered)."""
    card = page.locator("#arch-card")
    expect(card).to_have_attribute("data-shows", re.compile(re.escape(query)))
    expect(card).not_to_have_attribute("aria-busy", "true")


def test_the_card_opens_on_the_default_model_and_prints_no_null(page, live_stack, screenshot_dir):
    # A model whose name sorts before the default one: the page used to open on the first name.
    first_id = django_shell(
        "from playground.models import LanguageModel as M; "
        "print(M.objects.create(name='AAA first by name', source='bundled', is_enabled=True).pk)",
        live_stack.env,
    )
    try:
        page.goto("/architecture/")
        models = page.evaluate("fetch('/api/models/').then((r) => r.json())")
        default = next(m for m in models if m["is_default"])
        expect(page.locator("#arch-model")).to_have_value(f"model:{default['id']}")
        settled(page, f"model:{default['id']}?")
        assert str(default["id"]) != first_id
        card = page.locator("#arch-card")
        expect(card.locator(".arch-name")).to_contain_text(default["name"])
        assert page.evaluate(NULL_TEXT) == []
        # Units with a space, as "538.1 MB" has: "552 MFLOP", never "552.1MFLOP".
        text = card.inner_text()
        assert re.search(r"\d (k|M|G|T|P)?FLOP", text) and not re.search(r"\d(k|M|G|T|P)?FLOP", text)
        # The site's controls, not the browser's bare ones.
        for control in ("#arch-model", "#arch-context", "#arch-dtype"):
            assert page.locator(control).evaluate("(el) => getComputedStyle(el).borderRadius") == "6px"
        # The real DeepSeek-V3 config (no vision part, not random weights): no "null" either.
        page.select_option("#arch-model", "ref:deepseek_v3_671b")
        settled(page, "ref:deepseek_v3_671b?")
        assert page.evaluate(NULL_TEXT) == []
        page.screenshot(path=str(screenshot_dir / "architecture.png"), full_page=True)
    finally:
        delete = f"from playground.models import LanguageModel as M; print(M.objects.filter(pk={first_id}).delete())"
        django_shell(delete, live_stack.env)


def test_a_quick_model_then_dtype_change_renders_the_last_choice(page):
    page.add_init_script(SLOW_FIRST)
    page.goto("/architecture/")
    expect(page.locator("#arch-card .arch-name")).to_be_visible()
    renders = "() => window.__renders"
    page.evaluate("""() => { window.__renders = 0; const card = document.getElementById('arch-card');
        new MutationObserver(() => window.__renders++).observe(card, {childList: true}); }""")
    page.select_option("#arch-model", "ref:deepseek_v3_671b")  # answered late (no dtype)
    page.select_option("#arch-dtype", "float32")  # answered at once
    card = page.locator("#arch-card")
    weights = card.locator("tr", has=page.locator("th", has_text="weights")).first
    expect(card.locator(".arch-name")).to_contain_text("DeepSeek-V3")
    expect(weights).to_contain_text("float32")
    page.wait_for_timeout(2500)  # the late answer has come by now
    expect(weights).to_contain_text("float32")  # not replaced by the late answer's bfloat16
    assert page.evaluate(renders) == 1  # one render for the choice on screen, none for the stale one
    settled(page, "ref:deepseek_v3_671b?context=4096&dtype=float32")
