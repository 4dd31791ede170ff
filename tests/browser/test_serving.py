"""Several chats streaming at once, batched by one worker, and the serving page showing them
share steps: three people (three browser contexts, three sessions) send at the same moment."""

from __future__ import annotations

import time

import pytest
from playwright.sync_api import expect

from .conftest import RECORD_EVENTS, WAIT_MS
from .test_chat import open_chat, send

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(600)]

NUM_CHATS = 3


def new_page(chromium, base_url: str):
    context = chromium.new_context(base_url=base_url, viewport={"width": 1300, "height": 900}, bypass_csp=True)
    context.set_default_timeout(WAIT_MS)
    context.add_init_script(RECORD_EVENTS)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return context, page, errors


def test_three_chats_stream_at_once_and_the_serving_page_shows_them_sharing_steps(
    chromium, live_stack, screenshot_dir
) -> None:
    live_stack.ensure_worker()
    opened = [new_page(chromium, live_stack.base_url) for _ in range(NUM_CHATS + 1)]
    try:
        serving = opened[0][1]
        # The worker is up but idle (it sends no steps): the page names it instead of waiting for one.
        # It lists the workers alive when it connects: one an earlier test killed (no clean stop
        # deletes its key) is listed until its 5 s heartbeat expires, so reload until it went.
        deadline = time.monotonic() + 15
        while True:
            serving.goto("/serving/")
            expect(serving.locator("#conn")).to_have_attribute("data-state", "open")
            serving.wait_for_selector(".sv-card.sv-idle")
            if serving.locator(".sv-card.sv-idle").count() == 1 or time.monotonic() > deadline:
                break
            time.sleep(1)
        expect(serving.locator(".sv-card.sv-idle")).to_have_count(1)
        expect(serving.locator(".sv-card.sv-idle")).to_contain_text("idle")
        # It says what one browser can do (a third tab of the same browser is refused).
        expect(serving.locator(".serving-intro")).to_contain_text("each browser runs at most 2 generations at once")
        chats = [page for _, page, _ in opened[1:]]
        for page in chats:
            open_chat(page, max_tokens=40)
        for i, page in enumerate(chats):
            send(page, f"Tell me a short story about a fox number {i}.")
        for page in chats:  # all three stream at the same time: each sees its first tokens before any finished
            expect(page.locator(".msg-assistant .tok").first).to_be_visible()
        for page in chats:
            expect(page.locator(".msg-assistant .finish")).to_be_visible()
            assert page.locator(".msg-assistant .msg-body").inner_text().strip()
        shared = serving.locator(".sv-row").filter(has=serving.locator(".sv-decode:nth-child(2)"))
        expect(shared.first).to_be_visible()  # a step in which at least two requests decoded together
        # Every segment is wide enough to be seen and says whose it is; no summary is cut.
        for segment in shared.first.locator(".sv-seg").all():
            assert segment.inner_text().startswith("#") and segment.bounding_box()["width"] >= 20
        is_cut = "(els) => els.filter((e) => e.scrollWidth > e.clientWidth).length"
        assert serving.locator(".sv-meta").evaluate_all(is_cut) == 0
        expect(serving.locator(".sv-card")).to_have_count(1)
        expect(serving.locator(".sv-card")).to_contain_text("KV blocks")
        serving.screenshot(path=str(screenshot_dir / "serving.png"), full_page=False)
        chats[0].screenshot(path=str(screenshot_dir / "chat-batched.png"))
    finally:
        for context, _, errors in opened:
            context.close()
            assert not errors, f"uncaught errors in a page: {errors}"
