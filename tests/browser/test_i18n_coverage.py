"""No visible English UI text in zh-Hans: every page in a browser whose language is Chinese, each
in the states that show most of its UI (a chat answer with its stats, card and prompt; an
explorer step with its inside views; the A/B page; serving; an architecture card; the admin's
index, lists and forms), its UI strings checked against the catalogs. At least 98% must be in
Chinese; the rest is listed in test-artifacts/i18n/pages.txt (the lesson page has its own check
in test_learn.py, after its walk)."""

from __future__ import annotations

import json
import urllib.request

import pytest
from playwright.sync_api import expect

from tests.conftest import django_shell

from .conftest import _new_page
from .i18n_check import Report, coverage_report, write_report

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

ADMIN_USER, ADMIN_PASSWORD = "i18n-staff", "i18n-staff-password"
# Records' own values in the admin's lists, filters and read-only fields are data, not UI.
ADMIN_DATA = (
    "#result_list td, #result_list tbody th, .readonly, #changelist-filter ul li:not(:first-child), .breadcrumbs, "
    "#user-tools strong"
)


@pytest.fixture
def zh_page(chromium, live_stack):
    yield from _new_page(chromium, live_stack, bypass_csp=False, locale="zh-CN")


def record_names(live_stack) -> set[str]:
    with urllib.request.urlopen(live_stack.base_url + "/api/models/", timeout=30) as response:
        return {model["name"] for model in json.loads(response.read())}


def chat(page, data: set[str]) -> Report:
    page.goto("/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#preset-select option")).not_to_have_count(0)
    page.fill("#ov-max-tokens", "8")
    page.fill("#prompt-input", "请给我讲一个故事")
    page.press("#prompt-input", "Enter")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    answer.locator(".details-btn").click()  # the strip, every number and how it was served are counted too
    expect(answer.locator(".msg-serving .colocated")).to_be_visible()
    report = coverage_report(page, "chat", data)
    answer.locator(".tok").first.hover()
    expect(page.locator("#token-popover")).to_be_visible()
    report.add(coverage_report(page, "chat token card", data))
    page.keyboard.press("Escape")  # the card closes
    expect(page.locator("#token-popover")).to_be_hidden()
    answer.locator(".prompt-btn").click()
    expect(page.locator("#prompt-dialog .prompt-view")).to_be_visible()
    report.add(coverage_report(page, "chat prompt", data))
    return report


def explorer(page, data: set[str]) -> Report:
    page.goto("/explorer/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#ex-model option")).not_to_have_count(0)
    page.click("#ex-step")
    expect(page.locator(".step-tok")).to_have_count(1)
    expect(page.locator("#ex-serving .colocated")).to_be_visible()
    report = coverage_report(page, "explorer", data)
    for view in ("waterfall", "kv", "roofline"):
        page.click(f'[data-inside="{view}"]')
        expect(page.locator(f"#inside-{view}")).to_be_visible()
        report.add(coverage_report(page, f"explorer inside {view}", data))
    return report


def simple_pages(page, data: set[str]) -> Report:
    report = Report()
    page.goto("/explorer/ab/")
    expect(page.locator("#ab-a-preset option")).not_to_have_count(0)
    report.add(coverage_report(page, "A/B", data))
    page.goto("/serving/")
    report.add(coverage_report(page, "serving", data))
    page.goto("/architecture/")
    expect(page.locator("#arch-card .arch-table").first).to_be_visible()
    report.add(coverage_report(page, "architecture", data))
    return report


def admin(page, live_stack, data: set[str]) -> Report:
    django_shell(
        "from django.contrib.auth.models import User\n"
        f"User.objects.filter(username={ADMIN_USER!r}).exists() or "
        f"User.objects.create_superuser({ADMIN_USER!r}, 'i18n@example.com', {ADMIN_PASSWORD!r})\n"
        "print('ok')",
        live_stack.env,
    )
    page.goto("/admin/login/?next=/admin/")
    report = coverage_report(page, "admin login", data)
    page.fill("#id_username", ADMIN_USER)
    page.fill("#id_password", ADMIN_PASSWORD)
    page.click("input[type=submit]")
    expect(page.locator("#content-main")).to_be_visible()
    for path in (
        "/admin/",
        "/admin/playground/languagemodel/",
        "/admin/playground/languagemodel/1/change/",
        "/admin/playground/samplingpreset/add/",
        "/admin/playground/generation/",
        "/admin/playground/apikey/add/",
    ):
        page.goto(path)
        expect(page.locator("#content")).to_be_visible()
        mark_data = "(s) => document.querySelectorAll(s).forEach((e) => e.setAttribute('data-i18n-data', ''))"
        page.evaluate(mark_data, ADMIN_DATA)
        report.add(coverage_report(page, f"admin {path}", data))
    return report


def test_the_pages_speak_chinese(zh_page, live_stack):
    page = zh_page
    data = record_names(live_stack)
    report = Report()
    for part in (chat(page, data), explorer(page, data), simple_pages(page, data), admin(page, live_stack, data)):
        report.add(part)
    path = write_report(report, "pages")
    print(report.summary())
    assert len(report.translated) > 300  # the check saw the pages' UI
    assert report.ratio >= 0.98, f"{report.summary()}\n(also in {path})"
