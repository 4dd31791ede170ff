"""Prefill/decode disaggregation in a real browser: a prefill worker (`-Q prefill`) and a
decode worker (`-Q decode`) next to live_stack's colocated worker. The PD toggles send
`"pd": true`, and the chat answer and the explorer show the handoff's timeline with both
workers' names, from the `generation.handoff` event and the finished stats."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.conftest import PDWorkers

from .test_chat import open_chat, send
from .test_explorer import open_explorer
from .ui import events, sent_commands, set_range, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(900)]

SEGMENT_NAMES = ["prefill", "serialize + store", "waiting", "fetch + load", "decode"]


@pytest.fixture(scope="module")
def started_pd_workers(pd_workers: PDWorkers) -> PDWorkers:
    pd_workers.ensure("prefill")
    pd_workers.ensure("decode")
    return pd_workers


def assert_timeline(timeline, stats: dict) -> None:
    """The bar has the five phases and the legend names both workers (from `stats`)."""
    expect(timeline.locator(".pd-seg")).to_have_count(5)
    expect(timeline.locator(".pd-item b")).to_have_text(SEGMENT_NAMES)
    expect(timeline.locator(".serving-head")).to_contain_text(
        f"prefill on {stats['prefill_worker']} → decode on {stats['decode_worker']}"
    )
    expect(timeline.locator(".pd-item-prefill")).to_contain_text(stats["prefill_worker"])
    expect(timeline.locator(".pd-item-decode")).to_contain_text(stats["decode_worker"])
    expect(timeline).not_to_have_class(re.compile(r"\blive\b"))  # finalised from the stats


def test_pd_chat_answer_shows_the_handoff_timeline(page, started_pd_workers, screenshot_dir):
    open_chat(page, max_tokens=8)
    page.check("#pd-toggle")
    send(page, "Name a colour.")
    finished = wait_for_events(page, "generation.finished", 1)[-1]
    assert finished["type"] == "generation.finished", finished
    assert sent_commands(page, "generate")[-1]["pd"] is True

    handoff = events(page, "generation.handoff")[-1]
    stats = finished["stats"]
    assert stats["prefill_worker"] == handoff["prefill_worker"] and stats["decode_worker"] == handoff["decode_worker"]
    assert handoff["prefill_worker"] != handoff["decode_worker"]
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    assert_timeline(answer.locator(".pd-timeline"), stats)
    expect(answer.locator(".msg-serving .colocated")).to_have_count(0)
    answer.screenshot(path=str(screenshot_dir / "chat-pd.png"))


def test_pd_explorer_run_shows_the_timeline_and_marks_the_handoff(page, started_pd_workers, screenshot_dir):
    open_explorer(page, "Once upon a time")
    page.check("#ex-pd")
    set_range(page, "#ex-run-length", 4)
    page.click("#ex-run")
    finished = wait_for_events(page, "generation.finished", 1)[-1]
    assert sent_commands(page, "complete")[-1]["pd"] is True
    assert_timeline(page.locator("#ex-serving .pd-timeline"), finished["stats"])

    # The decode worker's first step is told apart in the latency chart.
    if finished["stats"]["num_generated_tokens"] >= 3:
        expect(page.locator("#ex-handoff-legend")).to_be_visible()
        colours = page.evaluate("""() => Chart.getChart(document.getElementById("latency-chart"))
            .data.datasets[0].backgroundColor""")
        assert len(set(colours[:3])) == 3  # prefill, first after the handoff, decode
    page.locator("#ex-serving").screenshot(path=str(screenshot_dir / "explorer-pd.png"))


def test_timeline_clamps_clock_skew_and_grows_while_decoding(page):
    """serving.js alone, in the page: no workers needed."""
    page.goto("/")
    result = page.evaluate("""async () => {
        const { timelineSegments, pdTimeline } = await import("/static/js/serving.js");
        // The decode worker's clock runs 30 ms behind: decode_start is before handoff_stored.
        const handoff = {prefill_start: 1000, prefill_end: 1200, handoff_stored: 1250, decode_start: 1220,
                         kv_loaded: 1300};
        const live = timelineSegments(handoff, 500).map((s) => s.ms);
        const done = timelineSegments({...handoff, decode_end: 2000}, 500).map((s) => s.ms);
        const el = pdTimeline({prefill_worker: "p@a", decode_worker: "d@b", kv_transfer_bytes: 2048,
                               fetch_ms: 5, load_ms: 20, timeline: handoff}, 100);
        return {live, done, isLive: el.classList.contains("live"), legend: el.querySelector(".pd-legend").textContent};
    }""")
    assert result["live"] == [200, 50, 0, 80, 500]
    assert result["done"] == [200, 50, 0, 80, 700]  # decode_end wins over the live estimate
    assert result["isLive"]
    assert "p@a" in result["legend"] and "d@b · streaming" in result["legend"]
    assert "fetch 5.0 ms · load 20 ms · other 55 ms" in result["legend"]
