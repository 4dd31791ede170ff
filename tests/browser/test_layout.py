"""What every page must do whatever its content, in a real browser: no page scrolls sideways on
a 390 px phone and every tab of its top bar shows whole there, the Stop button that appears under
the pointer (where Send or Run was) stays readable while hovered, a token's card keeps off its
answer's buttons, and the model pickers show the chosen name whole at 1280 px."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .conftest import _new_page
from .test_chat import open_chat, send
from .test_explorer import open_explorer
from .ui import overflowing, set_range, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

PAGES = ("/", "/explorer/", "/explorer/ab/", "/serving/", "/architecture/")
PHONE = {"width": 390, "height": 844}
# Each tab of the top bar: its box, the box of the bar it may scroll inside (what shows of it),
# whether its text is cut, and whether it is what the pointer meets at its centre.
TABS = """() => {
  const bar = document.querySelector('.tabs').getBoundingClientRect();
  return [...document.querySelectorAll('.tabs a')].map((a) => {
    const b = a.getBoundingClientRect();
    const hit = document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2);
    return {text: a.textContent, left: b.left, right: b.right, barLeft: bar.left, barRight: bar.right,
            isCut: a.scrollWidth > a.clientWidth, isHit: a.contains(hit)};
  });
}"""
# The model pickers (dom.js wholeNamePicker): the page and its select.
PICKERS = {
    "/": "#model-select",
    "/explorer/": "#ex-model",
    "/explorer/ab/": "#ab-model",
    "/architecture/": "#arch-model",
}
# What a picker shows for its chosen option: the text, its box and the select's, and the lines the
# text takes (a line running past the box is cut).
PICKER_SHOWS = """(select) => {
  const shown = select.parentElement.querySelector('.picker-text');
  if (!shown) return null;
  const range = document.createRange();
  range.selectNodeContents(shown);
  const box = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
  return {text: shown.textContent, chosen: select.selectedOptions[0].textContent,
          box: box(shown.getBoundingClientRect()), select: box(select.getBoundingClientRect()),
          lines: [...range.getClientRects()].map(box), isCut: shown.scrollWidth > shown.clientWidth,
          window: {left: 0, top: 0, right: innerWidth, bottom: innerHeight}};
}"""

# WCAG contrast ratio of an element's text colour over its background colour (both opaque here).
CONTRAST = """(el) => {
  const rgb = (s) => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const lum = (c) => { const [r, g, b] = c.map(channel); return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const style = getComputedStyle(el);
  const [fg, bg] = [lum(rgb(style.color)), lum(rgb(style.backgroundColor))];
  const ratio = (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05);
  return { ratio, color: style.color, background: style.backgroundColor };
}"""
# Whether an element is what the pointer meets at its centre (nothing lies over it there).
IS_HIT = """(el) => {
  const b = el.getBoundingClientRect();
  return el.contains(document.elementFromPoint(b.left + b.width / 2, b.top + b.height / 2));
}"""


def page_width(page) -> dict:
    return page.evaluate("() => ({scroll: document.documentElement.scrollWidth, inner: innerWidth})")


def assert_no_sideways_scroll(page, where: str) -> None:
    width = page_width(page)
    wide = f"{where} scrolls sideways at {width['inner']} px: {width['scroll']} px wide, {overflowing(page)}"
    assert width["scroll"] <= width["inner"], wide


def test_no_page_scrolls_sideways_on_a_phone(page, chromium, live_stack, screenshot_dir):
    page.set_viewport_size({"width": 390, "height": 844})
    for path in PAGES:
        page.goto(path)
        expect(page.locator(".topbar")).to_be_visible()
        page.wait_for_load_state("networkidle")
        assert_no_sideways_scroll(page, path)
        assert_every_tab_shows_whole(page, path)
    # With content: a finished answer (its details open), a run in the explorer, a busy serving page.
    serving = page.context.new_page()
    serving.goto("/serving/")
    expect(serving.locator("#conn")).to_have_attribute("data-state", "open")
    open_chat(page, max_tokens=24)
    send(page, "Write two sentences about the sea.")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    answer.locator(".details-btn").click()
    assert_no_sideways_scroll(page, "the chat with an answer")
    page.screenshot(path=str(screenshot_dir / "chat-phone-details.png"), full_page=True)
    expect(serving.locator(".sv-row").first).to_be_visible()
    assert_no_sideways_scroll(serving, "the serving page with steps")
    serving.screenshot(path=str(screenshot_dir / "serving-phone.png"), full_page=True)
    open_explorer(page, "Once upon a time")
    set_range(page, "#ex-run-length", 6)
    page.click("#ex-run")
    wait_for_events(page, "generation.finished")
    expect(page.locator("#ex-step")).to_be_enabled()
    assert_no_sideways_scroll(page, "the explorer after a run")
    page.screenshot(path=str(screenshot_dir / "explorer-phone.png"), full_page=True)


def assert_every_tab_shows_whole(page, where: str) -> None:
    """Every tab on screen, whole, without scrolling the bar (at 390 px it cut "Serv…" and "架",
    and Architecture lay past the edge: only a sideways swipe of a bar with no scrollbar reached it)."""
    width = page.evaluate("innerWidth")
    for tab in page.evaluate(TABS):
        inside = max(0, tab["barLeft"]) - 0.5 <= tab["left"] and tab["right"] <= min(width, tab["barRight"]) + 0.5
        is_whole = inside and not tab["isCut"] and tab["isHit"]
        assert is_whole, f"{where} at {width} px: the tab {tab['text']!r} is cut: {tab}"


@pytest.fixture
def phone_page(request, chromium, live_stack):
    """A page whose browser speaks `request.param`, on a 390 px phone."""
    for page in _new_page(chromium, live_stack, bypass_csp=True, locale=request.param):
        page.set_viewport_size(PHONE)
        yield page


@pytest.mark.parametrize("phone_page", ["en-US", "zh-CN"], ids=["en", "zh-hans"], indirect=True)
def test_every_tab_of_the_top_bar_shows_whole_on_a_phone(phone_page, screenshot_dir):
    page = phone_page
    for path in ("/learn/", *PAGES):
        page.goto(path)
        expect(page.locator(".topbar")).to_be_visible()
        assert_every_tab_shows_whole(page, path)
    language = page.evaluate("document.documentElement.lang")
    page.locator(".topbar").screenshot(path=str(screenshot_dir / f"topbar-phone-{language}.png"))


def test_a_tokens_card_keeps_off_its_answers_buttons(page):
    """On a one-line answer the card went below the token, over Regenerate and Copy, and stayed
    there as the pointer crossed it to them (on a phone the card is nearly as wide as the answer,
    so it always reached the buttons at the line's right end)."""
    page.set_viewport_size(PHONE)
    open_chat(page, max_tokens=3)
    send(page, "Say hello.")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    assert answer.locator(".msg-body").evaluate("(el) => el.getClientRects().length") == 1  # one line
    card = page.locator("#token-popover")
    buttons = answer.locator(".msg-foot button")
    expect(buttons.first).to_be_visible()
    for token in answer.locator(".tok").all():
        token.hover()
        expect(card).to_be_visible()
        box = card.bounding_box()
        for button in buttons.all():
            covered = button.bounding_box()
            assert not overlaps(box, covered), f"the card {box} covers {button.get_attribute('aria-label')} {covered}"
    # the pointer goes from the token to Regenerate: the button is what it meets there
    regenerate = answer.locator(".regenerate-btn")
    regenerate.hover()
    assert regenerate.evaluate(IS_HIT)


def overlaps(a: dict, b: dict) -> bool:
    """Whether two Playwright bounding boxes share any area."""
    across = a["x"] < b["x"] + b["width"] and b["x"] < a["x"] + a["width"]
    return across and a["y"] < b["y"] + b["height"] and b["y"] < a["y"] + a["height"]


def within(inner: dict, outer: dict) -> bool:
    """Whether the box {left, right, top, bottom} `inner` lies inside `outer` (half a pixel of rounding)."""
    return all(inner[side] >= outer[side] - 0.5 for side in ("left", "top")) and all(
        inner[side] <= outer[side] + 0.5 for side in ("right", "bottom")
    )


def test_the_model_pickers_show_the_chosen_name_whole(page):
    """At 1280 px the pickers cut the names ("Qwen2.5-Coder-0.5B-Instruct (bundl…"): each option,
    once chosen, shows whole inside the window, and the select lies over it (a click opens the list)."""
    page.set_viewport_size({"width": 1280, "height": 800})
    for path, selector in PICKERS.items():
        page.goto(path)
        select = page.locator(selector)
        expect(select.locator("option").first).to_be_attached()
        values = select.locator("option").evaluate_all("(options) => options.map((o) => o.value)")
        for value in values:
            select.select_option(value)
            shows = select.evaluate(PICKER_SHOWS)
            where = f"{path} {selector} at 1280 px"
            assert shows is not None, f"{where}: no box shows the chosen name whole (the select alone cuts it)"
            assert shows["text"] == shows["chosen"], f"{where}: shows {shows['text']!r} for {shows['chosen']!r}"
            assert within(shows["box"], shows["window"]), f"{where}: past the window: {shows}"
            is_cut = shows["isCut"] or not all(within(line, shows["box"]) for line in shows["lines"])
            assert not is_cut, f"{where}: the name is cut: {shows}"
            assert within(shows["box"], shows["select"]), f"{where}: the select does not cover the name: {shows}"


def check_stop_under_the_pointer(page, stop_selector: str) -> None:
    stop = page.locator(stop_selector)
    expect(stop).to_be_visible()
    stop.hover()
    hovered = stop.evaluate(CONTRAST)
    assert hovered["ratio"] >= 4.5, f"Stop under the pointer: {hovered}"
    page.mouse.move(5, 5)
    assert stop.evaluate(CONTRAST)["ratio"] >= 4.5
    # Not `click()`: a short run (the explorer's longest is 64 tokens) may end during the checks
    # above, and a click waits for the hidden button to show again.
    stop.dispatch_event("click")


def test_stop_stays_readable_under_the_pointer(page):
    open_chat(page, max_tokens=300)
    page.hover("#send-btn")
    send(page, "Tell me a long story about a lighthouse keeper.")
    check_stop_under_the_pointer(page, "#stop-btn")
    expect(page.locator(".msg-assistant .finish")).to_have_text("cancelled")

    open_explorer(page, "Once upon a time")
    set_range(page, "#ex-run-length", 64)
    page.click("#ex-run")  # the pointer stays where Run was: Stop takes its place
    check_stop_under_the_pointer(page, "#ex-stop")
    wait_for_events(page, "generation.finished")
