"""The lesson page (/learn/) in a real browser, in English and in 简体中文, under the site's CSP:
every section runs its experiment against the real worker (and the random-weights DeepSeek
demos, registered for this module), and every number it shows is the one the run produced
(compared with the recorded events and the APIs); the links carry the section's settings into
the explorer; screenshots of each section at desktop and phone width; the switch changes the
language of every page and keeps it."""

from __future__ import annotations

import json
import re
import urllib.request
from urllib.parse import parse_qs, urlparse

import pytest
from playwright.sync_api import expect

from .i18n_check import coverage_report, write_report
from .ui import overflowing, runs, shown_text

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

SECTIONS = ["pipeline", "kv", "phases", "speculative", "roles", "sampling", "constrained", "deepseek"]
BUTTON = {"pipeline": "#lp-run", "kv": "#lk-run", "phases": "#lf-run", "speculative": "#lsd-run", "roles": "#lr-run",
          "sampling": "#ls-run", "constrained": "#lc-run", "deepseek": "#ld-run"}  # fmt: skip
# The smallest settings each section offers: the walk checks what the page shows, not speed.
SMALL = {"kv": {"#lk-tokens": "16"}, "phases": {"#lf-tokens": "16"}, "speculative": {"#lsd-tokens": "48"},
         "roles": {"#lr-tokens": "24"},
         "sampling": {"#ls-tokens": "8", "#ls-draws": "2"}, "deepseek": {"#ld-budget": "8"}}  # fmt: skip
LESSON_TITLES = {  # the lesson's own chapter titles (../shared/lesson/lesson-zh.txt)
    "pipeline": "大模型推理的基本流程",
    "kv": "推理优化：KV Cache",
    "phases": "推理阶段划分：Prefill vs Decode",
    "roles": "AI 对话的实现机制",
    "sampling": "文本生成的采样策略",
}
PHONE = {"width": 390, "height": 844}
FLAT = 1.15  # static/js/learn_kv.js: a line within this factor of its first step "stayed about flat"
TAIL = 8  # static/js/learn_kv.js: "the last steps" average over this many
# What a broken number leaves in a page's text (issue 48's done-when): none of them, anywhere.
BROKEN = re.compile(r"\b(?:NaN|null|undefined)\b|\ufffd")
CHARTS = "[...document.querySelectorAll('.learn-page canvas')]"
# The lesson's width with each chart canvas at `widths` (its inline width), measured at once.
LATE_CHARTS_WIDTH = f"""(widths) => {{
  const canvases = {CHARTS};
  const now = canvases.map((c) => c.style.width);
  canvases.forEach((c, i) => {{ c.style.width = widths[i]; }});
  const width = document.querySelector('.learn-page').scrollWidth;
  canvases.forEach((c, i) => {{ c.style.width = now[i]; }});
  return width;
}}"""


def measures(page, section: str) -> dict[str, float]:
    """The section's measured numbers as the page holds them (data-measure -> data-value)."""
    pairs = page.locator(f"#learn-{section} [data-measure]").evaluate_all(
        "els => els.map((e) => [e.dataset.measure, e.dataset.value])"
    )
    return {name: float(value) for name, value in pairs if value != ""}


def run_section(page, section: str) -> list[dict]:
    """Runs one section's experiment; returns the requests it made (with their events)."""
    before = len(runs(page))
    for select, value in SMALL.get(section, {}).items():
        page.select_option(select, value)
    page.click(BUTTON[section])
    box = page.locator(f"#learn-{section}")
    expect(box).not_to_have_attribute("data-state", "running", timeout=180_000)
    state = box.get_attribute("data-state")
    assert state == "done", f"section {section} ended {state}: {box.inner_text()[-1500:]}"
    return [run for run in runs(page)[before:] if run["finished"]]


def api(live_stack, path: str) -> dict:
    with urllib.request.urlopen(live_stack.base_url + path, timeout=30) as response:
        return json.loads(response.read())


def check_pipeline(page, made: list[dict]) -> None:
    (run,) = made
    m = measures(page, "pipeline")
    prefilled, model = run["prefilled"], run["started"]["model"]
    assert m["num_prompt_tokens"] == prefilled["num_prompt_tokens"] == len(run["started"]["prompt"]["tokens"])
    assert m["prefill_ms"] == pytest.approx(prefilled["prefill_ms"])
    assert (m["hidden_size"], m["num_layers"], m["vocab_size"]) == (
        model["hidden_size"],
        model["num_layers"],
        model["vocab_size"],
    )
    rows = page.locator("#lp-result .learn-dist-row")
    expect(rows).to_have_count(10)
    top = run["steps"][0]["top_raw"][:10]
    assert rows.evaluate_all("els => els.map((e) => Number(e.dataset.tokenId))") == [a["token_id"] for a in top]
    assert rows.evaluate_all("els => els.map((e) => Number(e.dataset.prob))") == pytest.approx([a["prob"] for a in top])
    # pick the second most likely token: it is appended and the next step runs from it
    rows.nth(1).click()
    expect(page.locator("#learn-pipeline")).to_have_attribute("data-state", "done")
    expect(page.locator("#lp-result .learn-picked")).to_have_count(1)
    second = [r for r in runs(page) if r["finished"]][-1]
    assert second["command"]["token_ids"] == [run["steps"][0]["top_raw"][1]["token_id"]]
    assert parse_qs(urlparse(page.get_attribute("#lp-link", "href")).query)["chat"] == ["0"]


def check_kv(page, made: list[dict]) -> None:
    cached, uncached = made
    assert cached["command"]["overrides"]["use_kv_cache"] is True
    assert uncached["command"]["overrides"]["use_kv_cache"] is False
    m = measures(page, "kv")
    assert m["cached_kv_bytes"] == cached["steps"][-1]["kv_cache_bytes"] > 0
    assert m["uncached_kv_bytes"] == uncached["steps"][-1]["kv_cache_bytes"] == 0
    decode = [s["latency_ms"] for s in cached["steps"] if s["phase"] == "decode"]
    assert m["cached_first_ms"] == pytest.approx(decode[0])
    assert m["cached_last_ms"] == pytest.approx(sum(decode[-8:]) / len(decode[-8:]))
    assert m["kv_bytes_per_token"] == cached["started"]["model"]["kv_bytes_per_token"]
    same = [s["token_id"] for s in cached["steps"]] == [s["token_id"] for s in uncached["steps"]]
    assert m["same_tokens"] == (1 if same else 0)
    chart = page.evaluate("() => Chart.getChart(document.getElementById('lk-chart')).data.datasets.map((d) => d.data)")
    assert chart == [decode, [s["latency_ms"] for s in uncached["steps"] if s["phase"] == "decode"]]
    # What each line did is said from its own steps (a fixed "its line climbs" once stood under a
    # flat no-cache line): rose, fell or stayed about flat, by last ÷ first.
    verdict = page.locator("#lk-result .learn-verdict")
    for line, run in (("cached", cached), ("uncached", uncached)):
        steps = [s["latency_ms"] for s in run["steps"] if s["phase"] == "decode"]
        growth = sum(steps[-TAIL:]) / len(steps[-TAIL:]) / steps[0]
        assert m[f"{line}_growth"] == pytest.approx(growth)
        trend = "rose" if growth >= FLAT else "fell" if growth <= 1 / FLAT else "flat"
        sentence = verdict.locator(f'[data-line="{line}"]')
        expect(sentence).to_have_attribute("data-trend", trend)
        expect(sentence).to_contain_text(f"{growth:.1f}")
    query = parse_qs(urlparse(page.get_attribute("#lk-link", "href")).query)
    assert query["kv_cache"] == ["0"] and query["run"] == ["16"]


def check_phases(page, made: list[dict], roofline: dict) -> None:
    (run,) = made  # the PD attempt is refused: no prefill or decode worker runs in this stack
    p = run["prefilled"]
    m = measures(page, "phases")
    assert m["num_prefilled_tokens"] == p["num_prefilled_tokens"] == p["num_prompt_tokens"]  # no prefix cache
    assert m["prefill_ms"] == pytest.approx(p["prefill_ms"])
    decode = [s["latency_ms"] for s in run["steps"] if s["phase"] == "decode"]
    assert m["num_decode_steps"] == len(decode)
    assert m["decode_ms_per_token"] == pytest.approx(sum(decode) / len(decode))
    assert m["prefill_ms_per_token"] == pytest.approx(p["prefill_ms"] / p["num_prefilled_tokens"])
    # both phases on the roofline the worker measured for this request, on the side its numbers put them
    assert roofline["generation_id"] == run["queued"]["generation_id"]
    verdict = page.locator("#lf-result #rl-verdict")
    for phase in ("prefill", "decode"):
        bound = "compute" if roofline[phase]["intensity"] >= roofline["device"]["ridge"] else "memory"
        expect(verdict.locator(f'[data-phase="{phase}"]')).to_have_attribute("data-bound", bound)
    assert roofline["prefill"]["intensity"] > 10 * roofline["decode"]["intensity"]
    # no point above its roof (it showed prefill at 147%): answered and shown, at most 100% (a roof
    # raised to a phase's own best is that phase's point, a rounding's width away)
    shares = {phase: roofline[phase]["fraction_of_roof"] for phase in ("prefill", "decode")}
    assert all(share <= 1 + 1e-9 for share in shares.values()), shares
    shown = page.locator('#lf-result #rl-table [data-row="fraction"] td[data-phase]').all_inner_texts()
    assert len(shown) == 2 and all(int(share.rstrip("%")) <= 100 for share in shown), shown
    pd_try = runs(page)[-1]
    assert pd_try["command"]["pd"] is True and pd_try["error"]["code"] == "no_worker_for_mode"
    expect(page.locator("#lf-pd .learn-explanation")).to_be_visible()  # an explanation, not an error
    expect(page.locator("#lf-pd .alert")).to_have_count(0)


def check_roles(page, made: list[dict]) -> None:
    tagged, plain = sorted(made, key=lambda r: not r["command"]["chat"])
    m = measures(page, "roles")
    assert m["tagged_prompt_tokens"] == len(tagged["started"]["prompt"]["tokens"])
    assert m["plain_prompt_tokens"] == len(plain["started"]["prompt"]["tokens"])
    assert m["template_tokens"] == m["tagged_prompt_tokens"] - m["plain_prompt_tokens"] > 0
    tagged_box = page.locator('#lr-result [data-kind="tagged"]')
    expect(tagged_box.locator(".span-special").first).to_be_visible()
    expect(tagged_box.locator(".learn-answer")).to_have_text(answer_shown(tagged))
    expect(page.locator('#lr-result [data-kind="plain"] .learn-answer')).to_have_text(answer_shown(plain))
    assert tagged["command"]["text"] == plain["command"]["text"] == page.input_value("#lr-text")


def answer_shown(run: dict) -> str:
    """A run's text as the lesson shows it: a character its end cut left out, and "…" for it."""
    text, is_cut = shown_text(run)
    return (text or "∅") + ("…" if is_cut else "")


def check_sampling(page, made: list[dict]) -> None:
    assert len(made) == 1 + 5 * 2 + 1  # argmax, 5 sampled strategies x 2 draws, beam search
    for row in page.locator("#ls-table tbody tr").all():
        key = row.get_attribute("data-strategy")
        draws = row.locator(".learn-draws li")
        ids = [int(i) for i in draws.evaluate_all("els => els.map((e) => e.dataset.generationId)")]
        by_id = {r["queued"]["generation_id"]: r for r in made}
        texts = [by_id[i]["finished"]["text"] for i in ids]
        assert draws.locator(".learn-draw").evaluate_all("els => els.map((e) => e.textContent)") == [
            shown_text(by_id[i])[0] or "∅" for i in ids
        ]
        if key in ("argmax", "beam"):  # one run, nothing drawn: no count of distinct texts ("1/1" said nothing)
            assert len(texts) == 1 and f"{key}_distinct" not in measures(page, "sampling")
            expect(row.locator(".learn-same")).to_be_visible()
        else:
            assert measures(page, "sampling")[f"{key}_distinct"] == len(set(texts))
        if key == "t15":  # the distribution it drew from is the run's own processed one
            shown = row.locator(".learn-dist-row").evaluate_all("els => els.map((e) => Number(e.dataset.prob))")
            step = by_id[ids[0]]["steps"][0]
            assert shown == pytest.approx([a["prob"] for a in step["top_processed"][:5]])
    overrides = [r["command"]["overrides"] for r in made]
    assert sorted({o["temperature"] for o in overrides if "temperature" in o}) == [0.3, 1, 1.5]


def check_constrained(page, made: list[dict]) -> None:
    """Section 7: the same question free and under the schema (greedy); every number is the
    constrained run's, the strip has one column per step, its heights the steps' `masked_prob`."""
    constrained = next(r for r in made if "grammar" in r["command"]["overrides"])
    free = next(r for r in made if "grammar" not in r["command"]["overrides"])
    grammar = constrained["command"]["overrides"]["grammar"]
    assert grammar["type"] == "json_schema" and json.loads(grammar["schema"]) == json.loads(
        page.input_value("#lc-schema")
    )
    assert free["command"]["text"] == constrained["command"]["text"] == page.input_value("#lc-question")
    steps = constrained["steps"]
    masses = [s["masked_prob"] for s in steps]
    assert all(m is not None and 0 <= m <= 1 for m in masses)
    assert all(s["masked_prob"] is None for s in free["steps"])
    m = measures(page, "constrained")
    assert m["num_steps"] == len(steps)
    assert m["mean_masked_prob"] == pytest.approx(sum(masses) / len(masses))
    assert m["max_masked_prob"] == pytest.approx(max(masses))
    assert m["overruled_steps"] == sum(x > 0.5 for x in masses)
    text = constrained["finished"]["text"]
    if constrained["finished"]["finish_reason"] == "grammar":
        json.loads(text)  # complete under the grammar: valid JSON
        assert m["valid_json"] == 1
    expect(page.locator("#lc-result [data-kind=constrained] .learn-answer")).to_have_text(answer_shown(constrained))
    expect(page.locator("#lc-result [data-kind=free] .learn-answer")).to_have_text(answer_shown(free))
    columns = page.locator("#lc-steps .mask-step")
    expect(columns).to_have_count(len(steps))
    shown = columns.evaluate_all("els => els.map((e) => Number(e.dataset.maskedProb))")
    assert shown == pytest.approx(masses)
    # the step that lost most is shown, with the removed tokens the step record lists
    worst = masses.index(max(masses))
    view = page.locator("#lc-result .mask-view")
    assert float(view.get_attribute("data-masked-prob")) == pytest.approx(masses[worst])
    removed = view.locator(".mask-tokens li").evaluate_all("els => els.map((e) => Number(e.dataset.tokenId))")
    assert removed == [a["token_id"] for a in steps[worst]["top_masked"]]
    query = parse_qs(urlparse(page.get_attribute("#lc-link", "href")).query)
    assert query["grammar_kind"] == ["json_schema"] and query["chat"] == ["1"]


def check_deepseek(page, made: list[dict], live_stack) -> None:
    card = api(live_stack, "/api/architectures/deepseek_v3_671b/?context=4096")
    m = measures(page, "deepseek")
    assert m["v3_total_params"] == card["parameters"]["total"]
    assert m["v3_kv_latent"] == card["kv_cache"]["bytes_per_token"]
    assert m["v3_kv_expanded"] == card["kv_cache"]["expanded_bytes_per_token"]
    check_reasoning(page, made)
    demo = next(r for r in made if r["started"]["model"].get("num_moe_layers"))
    assert m["demo_kv_per_token"] == demo["prefilled"]["kv_cache_bytes"] / demo["prefilled"]["num_prompt_tokens"]
    assert m["demo_kv_per_token"] == m["demo_kv_card"]  # MLA's latent cache, measured = computed
    assert m["demo_moe_layers"] == len(demo["steps"][0]["moe_routing"]) > 0
    image_run = next(r for r in made if r["command"].get("images"))
    image = image_run["started"]["prompt"]["images"][0]
    assert (m["image_tokens"], m["image_kv_bytes"]) == (image["num_tokens"], image["kv_bytes"])


def check_reasoning(page, made: list[dict]) -> None:
    """The R1-style run of section 8: the budget chosen, the counts from `stats`, the answer's
    tokens (the end of turn it may end on is none), and why there is no answer when there is none."""
    m = measures(page, "deepseek")
    reasoning = next(r for r in made if "max_thinking_tokens" in r["command"]["overrides"])
    stats, steps = reasoning["finished"]["stats"], reasoning["steps"]
    assert reasoning["command"]["overrides"]["max_thinking_tokens"] == 8  # the budget chosen
    assert reasoning["command"]["overrides"]["max_new_tokens"] == 8 + 64  # then </think> and the answer
    assert m["num_reasoning_tokens"] == stats["num_reasoning_tokens"] == sum(s["is_reasoning"] for s in steps)
    assert m["num_reasoning_tokens"] <= 8
    assert m["thinking_ended_by_budget"] == int(stats["thinking_ended_by_budget"])
    assert m["num_forced_tokens"] == sum(s["is_forced"] for s in steps)
    assert reasoning["command"]["text"].endswith("<think>\n")  # the model's own chat template, then R1's opening
    answer = [i for i, s in enumerate(steps) if not s["is_reasoning"] and not s["is_forced"]]
    if stats["finish_reason"] == "eos" and answer and answer[-1] == len(steps) - 1:
        answer.pop()  # the end of turn writes no answer
    assert m["num_answer_tokens"] == len(answer)
    expect(page.locator("#ld-result [data-no-answer]")).to_have_count(0 if answer else 1)


def check_speculative(page, made: list[dict]) -> None:
    """The same answer without and with prompt lookup (tests/browser/test_speculative.py checks the rest)."""
    plain, spec = made
    assert [s["token_id"] for s in plain["steps"]] == [s["token_id"] for s in spec["steps"]]
    expect(page.locator("#learn-speculative .learn-same")).to_have_attribute("data-same", "true")
    m = measures(page, "speculative")
    assert m["same_text"] == 1 and m["num_accepted_tokens"] == spec["finished"]["stats"]["num_accepted_tokens"]


CHECKS = {
    "pipeline": check_pipeline,
    "kv": check_kv,
    "speculative": check_speculative,
    "roles": check_roles,
    "sampling": check_sampling,
    "constrained": check_constrained,
}


@pytest.mark.parametrize("lesson_page", ["en-US", "zh-CN"], ids=["en", "zh-hans"], indirect=True)
def test_walk_the_lesson(lesson_page, live_stack, deepseek_demos, screenshot_dir):
    page = lesson_page
    language = "zh-hans" if "zh" in page.evaluate("navigator.language") else "en"
    page.goto("/learn/")
    expect(page.locator("html")).to_have_attribute("lang", language)
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#learn-model")).not_to_be_empty()
    if language == "zh-hans":
        for section, title in LESSON_TITLES.items():
            expect(page.locator(f"#learn-{section} h2")).to_have_text(title)
        expect(page.locator("#lr-text")).to_have_value("请给我讲一个故事")  # the lesson's own example
    # the sticky top bar would cover the top of each section's screenshot (CSSOM: the CSP allows it)
    page.evaluate("document.querySelector('.topbar').style.position = 'static'")
    for section in SECTIONS:
        if section == "phases":  # also keep the roofline the worker answered
            with page.expect_response(lambda r: r.url.endswith("/inspect/")) as answer:
                made = run_section(page, section)
            check_phases(page, made, answer.value.json())
        elif section == "deepseek":
            check_deepseek(page, run_section(page, section), live_stack)
        else:
            CHECKS[section](page, run_section(page, section))
        page.locator(f"#learn-{section}").screenshot(path=str(screenshot_dir / f"learn-{section}-{language}.png"))
    text = page.locator("body").inner_text()
    broken = [repr(text[max(0, m.start() - 30) : m.end() + 30]) for m in BROKEN.finditer(text)]
    assert not broken, f"every section run, the page shows {broken}"
    if language == "zh-hans":
        report = coverage_report(page, "/learn/")
        write_report(report, "learn")
        assert report.ratio >= 0.98, report.summary()
    desktop_widths = page.evaluate(f"{CHARTS}.map((c) => c.style.width)")
    page.set_viewport_size(PHONE)
    # the lesson fits a phone: nothing wider than the screen (the top bar is the pages' own)
    wide, inner = page.evaluate("[document.querySelector('.learn-page').scrollWidth, innerWidth]")
    assert wide <= inner, f"the lesson is {wide} px wide at {inner} px: {overflowing(page, '.learn-page')}"
    # also in the frame before Chart.js fits its canvases to their narrower boxes (it writes their
    # width in px): with the desktop widths set back for one synchronous measure
    assert page.evaluate(LATE_CHARTS_WIDTH, desktop_widths) <= inner
    for section in SECTIONS:
        page.locator(f"#learn-{section}").screenshot(path=str(screenshot_dir / f"learn-{section}-{language}-phone.png"))


@pytest.mark.parametrize("lesson_page", ["en-US"], indirect=True)
def test_runs_without_draws_and_the_reasoning_run_say_what_they_ran(lesson_page):
    """Section 5: argmax and beam search draw nothing (one run each), so their rows say the text is
    always the same instead of "distinct 1/1". Section 6: the answer's tokens leave out the end of
    turn, and a run with none says why."""
    page = lesson_page
    page.goto("/learn/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    check_sampling(page, run_section(page, "sampling"))
    check_reasoning(page, run_section(page, "deepseek"))


@pytest.mark.parametrize("lesson_page", ["en-US"], indirect=True)
def test_links_open_the_explorer_with_the_same_settings(lesson_page):
    page = lesson_page
    page.goto("/explorer/?text=Once+upon+a+time&chat=1&temperature=0.3&top_k=5&run=32&kv_cache=0&pd=1&beams=9")
    expect(page.locator("#ex-text")).to_have_value("Once upon a time")
    expect(page.locator("#ex-chat")).to_be_checked()
    expect(page.locator("#ex-kv-cache")).not_to_be_checked()
    expect(page.locator("#ex-prefix-cache")).to_be_checked()  # not in the link: the explorer's default
    expect(page.locator("#ex-pd")).to_be_checked()
    expect(page.locator("#ex-temperature-value")).to_have_text("0.30")
    expect(page.locator("#ex-top-k-value")).to_have_text("5")
    expect(page.locator("#ex-run-length-value")).to_have_text("32")
    expect(page.locator("#ex-beams")).to_have_value("1")  # 9 beams is out of range: ignored, not clamped


@pytest.mark.parametrize("lesson_page", ["en-US"], indirect=True)
def test_the_switch_changes_every_page_and_keeps_the_choice(lesson_page):
    page = lesson_page
    page.goto("/learn/")
    expect(page.locator(".tabs a").first).to_have_text("Learn")
    page.click('.lang-switch button[value="zh-hans"]')
    expect(page).to_have_url(re.compile(r"/learn/$"))
    expect(page.locator("html")).to_have_attribute("lang", "zh-hans")
    expect(page.locator(".tabs a").first).to_have_text("学习")
    expect(page.locator("#conn .conn-label")).to_have_text("已连接")  # from the JavaScript catalog, under the CSP
    for path, text in (("/", "你想问什么？"), ("/explorer/", "下一个 token"), ("/serving/", "连续批处理，实时查看")):
        page.goto(path)  # the browser still sends Accept-Language: en-US; the choice wins
        expect(page.locator("body")).to_contain_text(text)
    page.click('.lang-switch button[value="en"]')
    expect(page.locator("body")).to_contain_text("Continuous batching, live")
