"""Fixtures for the browser tests: Debian's Chromium driven by Playwright against the real
stack from tests/conftest.py (`live_stack`: Redis, a Celery worker with the bundled model,
daphne).

Owns: launching Chromium once per session, a fresh browser context (own cookies, so its own
session and conversations) per test, recording every WebSocket event the page receives
(`window.__events`) and every command it sends (`window.__sent`) so tests can compare the
UI with the data it was sent and check what it asked for, failing a test
on any uncaught page error, and the screenshot folder.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_prepare_step

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT_DIR = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"
# A model forward pass can take seconds on a busy CPU, and the worker loads the model on
# its first task: waits are generous, and no test asserts on durations.
WAIT_MS = 180_000

# Runs before the page's own scripts: wraps WebSocket so every received event and every
# sent command is kept.
RECORD_EVENTS = """
window.__events = [];
window.__sent = [];
const NativeWebSocket = window.WebSocket;
window.WebSocket = class extends NativeWebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener("message", (e) => { try { window.__events.push(JSON.parse(e.data)); } catch {} });
  }
  send(data) {
    try { window.__sent.push(JSON.parse(data)); } catch {}
    return super.send(data);
  }
};
"""


@pytest.fixture(scope="session")
def chromium() -> Iterator[object]:
    if not CHROMIUM.exists():
        pytest.skip(
            "Debian's Chromium is not at /usr/bin/chromium (apt-get install chromium); "
            "`playwright install` cannot download browsers here"
        )
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(chromium, live_stack) -> Iterator[object]:
    """A new page in its own context, pointed at the live stack (relative URLs work).

    The site's Content-Security-Policy is bypassed here only because Playwright's own
    `wait_for_function` evaluates strings (eval); `csp_page` keeps it, to show the pages
    work under it."""
    yield from _new_page(chromium, live_stack, bypass_csp=True)


@pytest.fixture
def csp_page(chromium, live_stack) -> Iterator[object]:
    """`page` with the site's CSP enforced (no `wait_for_function` with a string)."""
    yield from _new_page(chromium, live_stack, bypass_csp=False)


def _new_page(chromium, live_stack, bypass_csp: bool, locale: str | None = None) -> Iterator[object]:
    """`locale` ("zh-CN"): the browser's language, sent as Accept-Language (default: en-US)."""
    live_stack.ensure_worker()
    context = chromium.new_context(
        base_url=live_stack.base_url, viewport={"width": 1400, "height": 900}, bypass_csp=bypass_csp, locale=locale
    )
    context.set_default_timeout(WAIT_MS)
    context.add_init_script(RECORD_EVENTS)
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda error: page_errors.append(str(error)))
    yield page
    context.close()
    assert not page_errors, f"uncaught errors in the page: {page_errors}"


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    return SCREENSHOT_DIR


@pytest.fixture(scope="module")
def deepseek_demos(live_stack, tmp_path_factory) -> None:
    """Both random-weights demos, built into temporary folders and registered, as `make run` does."""
    for command, name in (("demo_model", "deepseek-v3-demo-random"), ("demo_vl_model", "deepseek-vl-demo-random")):
        out_dir = tmp_path_factory.mktemp("learn-demo") / name
        run_prepare_step(command, [sys.executable, "-m", "django", command, "--out-dir", str(out_dir)], live_stack.env)


@pytest.fixture
def lesson_page(request, chromium, live_stack):
    """A page whose browser speaks `request.param` ("en-US" or "zh-CN"), the CSP enforced."""
    yield from _new_page(chromium, live_stack, bypass_csp=False, locale=request.param)
