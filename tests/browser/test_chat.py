"""The chat page in a real browser against the real server and worker: streaming, stop,
token alternatives, the prompt view, editing, conversations, errors, safe Markdown."""

from __future__ import annotations

import base64
import io
import math

import pytest
from PIL import Image
from playwright.sync_api import expect

from .ui import events, fmt_prob, sent_commands, steps_of_last_generation, visible_piece, wait_for_events

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# Sets window.__sawPartial once an answer is on screen with text while still streaming.
WATCH_STREAMING = """() => {
  window.__sawPartial = false;
  new MutationObserver(() => {
    const body = document.querySelector(".msg-assistant .msg-body.streaming");
    if (body && body.textContent.trim()) window.__sawPartial = true;
  }).observe(document.getElementById("messages-inner"), {childList: true, subtree: true, characterData: true});
}"""


# Sends one `generate` with an image on a socket of its own; resolves with the first answer.
SEND_ONE_IMAGE = """(png) => new Promise((resolve) => {
  const ws = new WebSocket(`ws://${location.host}/ws/generate/`);
  ws.onopen = () => ws.send(JSON.stringify({command: "generate", request_id: "img", content: "What is this?",
    images: [{data: png, media_type: "image/png"}]}));
  ws.onmessage = (e) => { ws.close(); resolve(JSON.parse(e.data)); };
})"""


def png_base64() -> str:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 40, 40)).save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def open_chat(page, max_tokens: int) -> None:
    """Load the chat page and set the max-tokens override and a fixed seed."""
    page.goto("/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#preset-select option")).not_to_have_count(0)
    is_narrow = not page.locator("#ov-max-tokens").is_visible()
    if is_narrow:  # the settings panel slides in on a phone
        page.click(".settings-toggle")
    page.fill("#ov-max-tokens", str(max_tokens))
    page.fill("#ov-seed", "7")
    if is_narrow:
        page.keyboard.press("Escape")
        expect(page.locator("#settings")).not_to_be_in_viewport()


def open_details(answer) -> None:
    """Open an answer's details (the strip, every number, how it was served, the exports)."""
    answer.locator(".details-btn").click()
    expect(answer.locator(".msg-details")).to_be_visible()


def send(page, text: str) -> None:
    page.fill("#prompt-input", text)
    page.press("#prompt-input", "Enter")


def test_answer_streams_and_tokens_explain_themselves(page, screenshot_dir):
    open_chat(page, max_tokens=32)
    page.evaluate(WATCH_STREAMING)
    send(page, "Name three colours of the rainbow.")
    expect(page.locator("#prompt-input")).to_have_value("")
    expect(page.locator(".msg-user .bubble")).to_have_text("Name three colours of the rainbow.")

    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    finished = events(page, "generation.finished")[-1]
    steps = steps_of_last_generation(page)
    assert page.evaluate("window.__sawPartial"), "the answer never showed while streaming"
    assert 0 < len(steps) == finished["stats"]["num_generated_tokens"] <= 32  # the override applied
    assert answer.locator(".msg-body").inner_text().strip() != ""
    expect(answer.locator(".finish")).to_have_text(finished["finish_reason"])
    stats = finished["stats"]
    prompt_tokens, cached_tokens = stats["num_prompt_tokens"], stats["num_cached_tokens"]
    expect(answer.locator(".msg-stats")).to_contain_text(f"{prompt_tokens} prompt tok")
    expect(answer.locator(".msg-stats")).to_contain_text(f"{cached_tokens} cached")
    expect(answer.locator(".msg-stats")).to_contain_text(f"{prompt_tokens - cached_tokens} prefilled")
    expect(answer.locator(".msg-stats")).to_contain_text("TTFT")
    expect(answer.locator(".msg-stats")).to_contain_text("tok/s")

    # How it was served: PD off, so the server's (colocated) mode, and the worker's prefix cache.
    assert "pd" not in sent_commands(page, "generate")[-1]
    serving = answer.locator(".msg-serving")
    expect(serving.locator(".colocated")).to_have_text(f"colocated on {stats['worker']}")
    expect(serving.locator(".pd-timeline")).to_have_count(0)
    counters = stats["prefix_cache"]
    expect(serving.locator(".prefix-cache")).to_contain_text(
        f"{counters['hits']:,} hits / {counters['misses']:,} misses"
    )
    expect(serving.locator(".prefix-cache")).to_contain_text(f"{counters['num_stored_tokens']:,} tokens held")

    # Hover a generated token: its own piece and the model's top alternatives.
    token = answer.locator(".tok").first
    step = steps[int(token.get_attribute("data-step"))]
    token.hover()
    popover = page.locator("#token-popover")
    expect(popover).to_be_visible()
    expect(popover.locator(".popover-head .piece")).to_have_text(visible_piece(step["piece"]))
    rows = popover.locator("tbody tr")
    assert rows.count() >= min(2, len(step["top_raw"]))
    expect(rows.first).to_contain_text(visible_piece(step["top_raw"][0]["piece"]))
    expect(popover.locator("tr.chosen")).to_have_count(1)
    # Greedy (the default preset) draws nothing: its "sampled" distribution is all on the token
    # it took, as the A/B page computes it (not the raw one again).
    assert events(page, "generation.started")[-1]["params"]["greedy"] is True
    expect(popover.locator(".popover-meta")).to_contain_text("100% sampled")
    sampled = rows.evaluate_all("(rows) => rows.map((r) => r.cells[4].textContent)")
    chosen = rows.evaluate_all("(rows) => rows.map((r) => r.classList.contains('chosen'))")
    assert sampled == ["100%" if is_chosen else "0%" for is_chosen in chosen]
    page.screenshot(path=str(screenshot_dir / "chat-token.png"))

    # Colour by probability: each token carries its chosen-token probability.
    page.check("#colorize")
    expect(page.locator("#messages")).to_have_class("messages colorize")
    p = float(token.evaluate("(el) => el.style.getPropertyValue('--p')"))
    assert p == pytest.approx(math.exp(step["raw_logprob"]), abs=1e-3)
    page.mouse.move(700, 850)
    expect(popover).to_be_hidden()
    page.screenshot(path=str(screenshot_dir / "chat.png"), full_page=True)

    # The exact prompt: ChatML special tokens highlighted, one chip per prompt token.
    answer.locator(".prompt-btn").click()
    dialog = page.locator("#prompt-dialog")
    expect(dialog).to_be_visible()
    started = events(page, "generation.started")[-1]
    expect(dialog.locator(".chip")).to_have_count(len(started["prompt"]["tokens"]))
    assert dialog.locator(".span-special").count() >= 1
    expect(dialog.locator(".prompt-text")).to_contain_text("Name three colours of the rainbow.")
    page.screenshot(path=str(screenshot_dir / "chat-prompt.png"))
    page.click("#prompt-dialog-close")
    expect(dialog).to_be_hidden()


def test_an_answer_is_a_compact_line_and_its_details_are_one_click_away(page, screenshot_dir):
    """The text, then one line (tokens, first token, speed, finish reason, three buttons): the
    strip, the stats and how it was served open on request, the strip's explanation once a page."""
    open_chat(page, max_tokens=8)
    for number, question in enumerate(("Name a colour.", "Name a fruit."), start=1):
        send(page, question)
        wait_for_events(page, "generation.finished", number)
    answers = page.locator(".msg-assistant")
    for number, answer in enumerate(answers.all()):
        expect(answer.locator(".msg-details")).to_be_hidden()
        # Under the text: about one line of instruments (it was ~250 px: strip, 8-10 badges, serving, 5 buttons).
        below = answer.evaluate("""(el) => {
            const body = el.querySelector('.msg-body').getBoundingClientRect();
            return el.getBoundingClientRect().bottom - body.bottom; }""")
        assert below < 50, f"{below:.0f} px of instruments under the answer"
        stats = events(page, "generation.finished")[number]["stats"]
        expect(answer.locator(".msg-summary")).to_contain_text(f"{stats['num_generated_tokens']} tokens")
        expect(answer.locator(".finish")).to_be_visible()
        expect(answer.locator(".msg-foot button:visible")).to_have_count(4)  # regenerate, copy, prompt, details
    # Max tokens ending inside a multi-byte character: the half character is left out, and said so.
    cut = page.evaluate("""async () => {
        const { withoutCutCharacter } = await import("/static/js/chat_messages.js");
        const message = { isStreaming: false, stats: { finish_reason: "length" },
                          steps: [{ index: 0, text_delta: "Hi \ufffd", token_bytes: "f09f" }] };
        return withoutCutCharacter(message, "Hi \ufffd");
    }""")
    assert cut == {"text": "Hi ", "cutBytes": "0xF0 0x9F"}
    # The API's repetition penalty has a field here too (greedy and beam search use it as well).
    # Which tokens it counts: the empty choice names the preset's, "answer only" is sent as false.
    page.fill("#ov-repetition-penalty", "1.2")
    penalized = page.locator("#ov-penalize-prompt")
    preset_choice = (
        "answer only"
        if events(page, "generation.started")[-1]["params"]["penalize_prompt"] is False
        else "prompt and answer"
    )
    expect(penalized.locator("option").first).to_have_text(f"preset ({preset_choice})")
    penalized.select_option("false")
    send(page, "Name a number.")
    wait_for_events(page, "generation.finished", 3)
    sent = sent_commands(page, "generate")[-1]["overrides"]
    assert (sent["repetition_penalty"], sent["penalize_prompt"]) == (1.2, False)
    started = events(page, "generation.started")[-1]["params"]
    assert (started["repetition_penalty"], started["penalize_prompt"]) == (1.2, False)
    page.screenshot(path=str(screenshot_dir / "chat-compact.png"))
    for answer in answers.all():
        open_details(answer)
        expect(answer.locator(".surprise-strip")).to_be_visible()
        expect(answer.locator(".msg-stats .badge").first).to_be_visible()
    # The strip's explanation, once on the page: in the first open answer only.
    expect(page.locator(".strip-note:visible")).to_have_count(1)
    expect(answers.first.locator(".strip-note")).to_be_visible()
    answers.first.locator(".details-btn").click()
    expect(answers.first.locator(".msg-details")).to_be_hidden()
    expect(answers.nth(1).locator(".strip-note")).to_be_visible()  # now the first open one
    expect(page.locator(".strip-note:visible")).to_have_count(1)


def test_a_text_model_offers_no_image_button_and_refuses_an_image_before_writing_anything(page):
    open_chat(page, max_tokens=4)
    expect(page.locator("#attach-btn")).to_be_hidden()
    # A client that sends one anyway is refused at once: no conversation, no queued generation.
    refusal = page.evaluate(SEND_ONE_IMAGE, png_base64())
    assert (refusal["type"], refusal["code"]) == ("error", "images_not_supported"), refusal
    assert page.evaluate("fetch('/api/conversations/').then((r) => r.json())") == []
    model = next(m for m in page.evaluate("fetch('/api/models/').then((r) => r.json())") if m["is_default"])
    assert model["accepts_images"] is False  # the bundled SmolLM2 reads text only
    page.goto("/explorer/")
    expect(page.locator("#ex-model option")).not_to_have_count(0)
    expect(page.locator("#ex-attach")).to_be_hidden()


def test_stop_keeps_the_partial_answer(page):
    open_chat(page, max_tokens=400)
    send(page, "Tell me a long story about a dragon who learns to paint.")
    answer = page.locator(".msg-assistant").last
    page.wait_for_function("document.querySelectorAll('.msg-assistant .tok').length >= 2")
    page.click("#stop-btn")
    expect(answer.locator(".finish")).to_have_text("cancelled")
    expect(page.locator("#send-btn")).to_be_visible()
    expect(page.locator("#stop-btn")).to_be_hidden()
    stats = events(page, "generation.finished")[-1]["stats"]
    assert 2 <= stats["num_generated_tokens"] < 400
    assert answer.locator(".msg-body").inner_text().strip() != ""


def test_refused_request_shows_the_error_and_keeps_the_input(page):
    open_chat(page, max_tokens=10_000_000)
    send(page, "Hello there")
    error = page.locator("#composer-error")
    expect(error).to_be_visible()
    refusal = events(page, "error")[-1]
    expect(error).to_contain_text(refusal["code"])
    expect(page.locator("#prompt-input")).to_have_value("Hello there")
    expect(page.locator(".msg")).to_have_count(0)


def test_edit_regenerate_and_manage_conversations(page):
    open_chat(page, max_tokens=4)
    send(page, "Say hello.")
    wait_for_events(page, "generation.finished", 1)

    page.locator(".msg-user .edit-btn").click()
    page.fill(".msg-edit textarea", "Say goodbye.")
    page.click("text=Save & send")
    wait_for_events(page, "generation.finished", 2)
    expect(page.locator(".msg")).to_have_count(2)
    expect(page.locator(".msg-user .bubble")).to_have_text("Say goodbye.")
    expect(page.locator(".msg-assistant .finish")).to_be_visible()

    page.locator(".msg-assistant .regenerate-btn").click()
    wait_for_events(page, "generation.finished", 3)
    queued = events(page, "generation.queued")
    assert queued[-1]["message_id"] != queued[-2]["message_id"]  # a new answer replaced the old one
    expect(page.locator(".msg")).to_have_count(2)
    expect(page.locator(".msg-assistant .finish")).to_be_visible()

    # The conversation is stored: reload, open it from the sidebar, rename, delete.
    page.goto("/")
    item = page.locator(".conv-item")
    expect(item).to_have_count(1)
    item.click()
    expect(page.locator(".msg-user .bubble")).to_have_text("Say goodbye.")
    expect(page.locator(".msg")).to_have_count(2)

    item.get_by_role("button", name="Rename").click()
    page.fill(".conv-item input", "Greetings")
    page.press(".conv-item input", "Enter")
    expect(page.locator(".conv-item .conv-title")).to_have_text("Greetings")
    expect(page.locator("#chat-title")).to_have_text("Greetings")

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator(".conv-item").get_by_role("button", name="Delete").click()
    expect(page.locator(".conv-item")).to_have_count(0)
    expect(page.locator("#chat-title")).to_have_text("New chat")
    expect(page.locator(".empty-state")).to_be_visible()


def test_model_markdown_is_rendered_safely_with_token_spans(csp_page):
    page = csp_page
    page.goto("/")
    result = page.evaluate("""async () => {
        const { renderAnswer } = await import("/static/js/markdown.js");
        const deltas = ["<think>", "plan", "</think>", "**Hi**", " <script>window.__pwned = 1</script>",
                        " <img src=x onerror='window.__pwned = 2'>", " [link](javascript:window.__pwned=3)",
                        " ![a cat](http://127.0.0.1:9/cat.png)"];
        const text = deltas.join("");
        const charTokens = deltas.flatMap((d, i) => Array.from(d, () => i));
        const box = document.createElement("div");
        document.body.append(box);
        // Where the blocks are comes from the server (inference.text.reasoning.segments_for_browser).
        const segments = [{kind: "reasoning", start: 7, end: 11, is_open: false},
                          {kind: "answer", start: 19, end: text.length, is_open: false}];
        renderAnswer(box, text, charTokens, new Set(), segments);
        await new Promise((r) => setTimeout(r, 50));
        return {
            pwned: window.__pwned ?? null,
            scripts: box.querySelectorAll("script, img").length,
            text: box.textContent,
            reasoning: box.querySelector("details.reasoning .md")?.textContent,
            bold: box.querySelector("strong")?.textContent,
            boldStep: box.querySelector("strong .tok")?.dataset.step,
            href: box.querySelector("a")?.getAttribute("href") ?? null,
            imageLink: [...box.querySelectorAll("a.md-image-link")].map((a) => [a.getAttribute("href"), a.textContent]),
            fetchedImages: performance.getEntriesByType("resource").filter((r) => r.name.includes("cat.png")).length,
        };
    }""")
    assert result["pwned"] is None
    assert result["scripts"] == 0
    assert "<script>window.__pwned = 1</script>" in result["text"]  # shown as text, not run
    assert result["reasoning"].strip() == "plan"
    assert result["bold"] == "Hi" and result["boldStep"] == "3"
    assert result["href"] is None or not result["href"].startswith("javascript:")
    # A Markdown image is a link the user may follow, never fetched by the page.
    assert result["imageLink"] == [["http://127.0.0.1:9/cat.png", "🖼 a cat"]]
    assert result["fetchedImages"] == 0


# Runs before the page's scripts: records every Content-Security-Policy violation.
RECORD_CSP_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (e) => window.__cspViolations.push(
  `${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`));
"""


def test_the_pages_work_under_the_strict_csp(csp_page):
    page = csp_page
    page.add_init_script(RECORD_CSP_VIOLATIONS)
    open_chat(page, max_tokens=4)
    response = page.request.get("/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    send(page, "Hi")
    expect(page.locator(".msg-assistant .finish")).to_be_visible()
    assert page.evaluate("window.__cspViolations") == []
    page.goto("/explorer/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    assert page.evaluate("window.__cspViolations") == []


def test_phone_width_layout(page, screenshot_dir):
    page.set_viewport_size({"width": 390, "height": 844})
    open_chat(page, max_tokens=6)
    expect(page.locator("#sidebar")).not_to_be_in_viewport()
    send(page, "What is 2 + 2?")
    expect(page.locator(".msg-assistant .finish")).to_be_visible()
    page.screenshot(path=str(screenshot_dir / "chat-phone.png"))
    page.locator(".sidebar-toggle").click()
    expect(page.locator("#sidebar")).to_be_in_viewport()
    expect(page.locator(".conv-item")).to_have_count(1)


def test_a_reload_mid_answer_loses_no_step(page):
    """The reloaded page's snapshot (the row, saved about once a second, plus the steps published
    since, coord/recent_steps.py) meets the live stream: every step index once, none missing, and
    the final strip counts every token (it said "over 190 tokens" of 200)."""
    open_chat(page, max_tokens=200)
    send(page, "Explain how a CPU cache works, in detail.")
    page.wait_for_function("document.querySelector('.msg-assistant .msg-body')?.textContent.length >= 60")
    page.reload()
    attached = wait_for_events(page, "generation.attached")[-1]
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    finished = events(page, "generation.finished")[-1]
    num_tokens = finished["stats"]["num_generated_tokens"]
    snapshot = [s["index"] for s in attached["steps"]]
    assert snapshot == list(range(len(snapshot))) and snapshot, "the snapshot itself has a hole"
    live = sorted({s["index"] for e in events(page, "generation.tokens") for s in e["steps"]} - set(snapshot))
    assert snapshot + live == list(range(num_tokens)), "steps between the snapshot and the live stream are missing"
    assert "".join(s["text_delta"] for s in attached["steps"]) == attached["text"]
    expect(answer.locator(".strip-cell")).to_have_count(num_tokens)
    expect(answer.locator(".answer-ppl")).to_contain_text(f"over {num_tokens} tokens")


def test_a_reload_during_a_generation_re_attaches_to_it_and_can_stop_it(page, screenshot_dir):
    open_chat(page, max_tokens=400)
    send(page, "Tell me a very long story about a lighthouse.")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".tok").nth(3)).to_be_visible()
    page.reload()
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    answer = page.locator(".msg-assistant").last
    expect(page.locator("#stop-btn")).to_be_visible()  # the page knows the answer is still running
    attached = wait_for_events(page, "generation.attached")[-1]
    assert attached["status"] == "running"
    num_before = answer.locator(".tok").count()
    expect(answer.locator(".tok").nth(num_before + 3)).to_be_attached()  # and keeps streaming
    page.click("#stop-btn")
    expect(answer.locator(".finish")).to_have_text("cancelled")
    expect(page.locator("#stop-btn")).to_be_hidden()
    text = answer.locator(".msg-body").inner_text()
    finished = events(page, "generation.finished")[-1]
    assert finished["text"].strip() and text.strip().startswith(finished["text"].strip()[:20])
    page.screenshot(path=str(screenshot_dir / "chat-reattached.png"))


def test_beam_search_answer_is_hoverable_and_shows_its_beams(page, screenshot_dir):
    open_chat(page, max_tokens=12)
    page.select_option("#preset-select", label="Beam search")
    send(page, "What is the capital of France?")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    generation_id = events(page, "generation.queued")[-1]["generation_id"]
    beam_steps = [
        s for e in events(page, "generation.beams") if e["generation_id"] == generation_id for s in e["steps"]
    ]
    best = events(page, "generation.finished")[-1]["stats"]["sequences"][0]
    assert beam_steps and not steps_of_last_generation(page)
    assert "".join(best["text_deltas"]) == best["text"]
    expect(answer.locator(".msg-body")).to_contain_text(best["text"].strip()[:20])
    # Beam search samples nothing: no surprise strip (it said "answer perplexity –").
    expect(answer.locator(".surprise-strip")).to_have_count(0)
    expect(answer).not_to_contain_text("perplexity")

    # Every token with text is a hoverable span; its card shows the search's own numbers.
    shown = sorted({int(i) for i in answer.locator(".tok").evaluate_all("(els) => els.map((e) => e.dataset.step)")})
    deltas = best["text_deltas"]
    assert {i for i, d in enumerate(deltas) if d.strip()} <= set(shown) <= {i for i, d in enumerate(deltas) if d}
    index = shown[1]
    answer.locator(f'.tok[data-step="{index}"]').first.hover()
    popover = page.locator("#token-popover")
    logprob = best["token_logprobs"][index]
    expect(popover.locator('[data-field="prob"]')).to_have_text(fmt_prob(math.exp(logprob)))
    expect(popover.locator('[data-field="logprob"]')).to_have_text(f"{logprob:.3f}")
    expect(popover.locator('[data-field="logprob-sum"]')).to_have_text(
        f"{sum(best['token_logprobs'][: index + 1]):.3f}"
    )
    expect(popover.locator("tbody tr")).to_have_count(len(beam_steps[index]["beams"]))
    expect(popover.locator("tr.chosen")).to_have_count(1)
    page.screenshot(path=str(screenshot_dir / "chat-beam-token.png"))
    page.mouse.move(700, 850)

    # The beams: the final hypotheses best first, with the streamed scores; the answer marked.
    finished_beams = {tuple(b["token_ids"]): b for s in beam_steps for b in s["beams"] if b["is_finished"]}
    finished_beams[tuple(best["token_ids"])] = best
    num_beams = max(sum(not b["is_finished"] for b in s["beams"]) for s in beam_steps)
    expected = sorted(finished_beams.values(), key=lambda b: -b["score"])[:num_beams]
    answer.locator(".beam-panel summary").click()
    items = answer.locator(".beam-list li")
    scores = items.evaluate_all("(els) => els.map((e) => Number(e.dataset.score))")
    assert scores == pytest.approx([b["score"] for b in expected])
    expect(answer.locator(".beam-list li.chosen .badge")).to_have_text("answer")
    expect(answer.locator(".beam-tree g.node:not(.root)")).to_have_count(sum(len(s["beams"]) for s in beam_steps))
    answer.screenshot(path=str(screenshot_dir / "chat-beams.png"))

    # Reloaded, the stored answer loads its beam steps on first hover: the same card and panel.
    page.reload()
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".msg-body")).to_contain_text(best["text"].strip()[:20])
    answer.locator(".msg-body").hover()
    answer.locator(f'.tok[data-step="{index}"]').first.hover()
    expect(popover.locator('[data-field="prob"]')).to_have_text(fmt_prob(math.exp(logprob)))
    expect(answer.locator(".beam-list li")).to_have_count(len(expected))
