"""What every page must do whatever its content, in a real browser: no page scrolls sideways on
a 390 px phone, and the Stop button that appears under the pointer (where Send or Run was)
stays readable while hovered."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .test_chat import open_chat, send
from .test_explorer import open_explorer
from .ui import overflowing, set_range, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

PAGES = ("/", "/explorer/", "/explorer/ab/", "/serving/", "/architecture/")

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
        # Every tab can be reached, the connection state is on screen.
        for tab in page.locator(".tabs a").all():
            tab.scroll_into_view_if_needed()
            assert tab.bounding_box()["x"] + tab.bounding_box()["width"] <= 390
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
