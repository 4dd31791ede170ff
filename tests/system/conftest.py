"""Fixtures for the end-to-end tests (the services themselves come from tests/conftest.py)."""

from __future__ import annotations

import pytest

from .wsclient import BrowserTab


@pytest.fixture
def tab(live_stack) -> BrowserTab:
    """A fresh browser (own session) that loaded the chat page; the stack has a live worker."""
    live_stack.ensure_worker()
    browser_tab = BrowserTab(live_stack.base_url, live_stack.ws_url)
    status, _ = browser_tab.get("/")
    assert status == 200
    assert "sessionid" in browser_tab.cookie_header()
    return browser_tab
