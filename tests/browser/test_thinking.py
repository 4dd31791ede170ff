"""The thinking budget in the chat, on the bundled SmolLM2 with a ChatML template that opens
`<think>` as DeepSeek-R1's does (its vocabulary has no `</think>` token, so the budget forces the
tag's token sequence): the reasoning block's token count and share match the engine's stats,
its tokens explain themselves, the stats say the budget ended thinking, and the next turn's
prompt view says the template dropped the earlier reasoning."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.conftest import django_shell
from tests.playground.fake_engine import R1_CHATML

from .test_chat import open_chat, send
from .ui import events, steps_of_last_generation, visible_piece

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

BUDGET = 3
USE_TEMPLATE = """
from playground.models import ChatTemplate, LanguageModel
model = LanguageModel.objects.get(is_default=True)
old = model.default_chat_template_id
template, _ = ChatTemplate.objects.get_or_create(name="R1-style ChatML (test)", defaults={{"source": {source}}})
model.default_chat_template = template
model.save()
print(old)
"""
RESTORE_TEMPLATE = """
from playground.models import LanguageModel
LanguageModel.objects.filter(is_default=True).update(default_chat_template_id={old})
print("ok")
"""


@pytest.fixture
def r1_template(live_stack) -> Iterator[None]:
    """The default model renders chats with `R1_CHATML` for this test only."""
    old = django_shell(USE_TEMPLATE.format(source=json.dumps(R1_CHATML)), live_stack.env)
    yield
    django_shell(RESTORE_TEMPLATE.format(old=old), live_stack.env)


def test_the_budget_ends_thinking_and_the_chat_counts_it(r1_template, page, screenshot_dir):
    open_chat(page, max_tokens=24)
    page.fill("#ov-max-thinking", str(BUDGET))
    send(page, "What is 2+2?")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()
    stats = events(page, "generation.finished")[-1]["stats"]
    steps = steps_of_last_generation(page)
    started = events(page, "generation.started")[-1]
    assert started["params"]["max_thinking_tokens"] == BUDGET
    assert started["prompt"]["text"].endswith("<think>\n")

    # The engine: 3 reasoning tokens, then `</think>` forced token by token, then the answer.
    assert (stats["num_reasoning_tokens"], stats["thinking_ended_by_budget"]) == (BUDGET, True)
    assert [s["is_reasoning"] for s in steps[:BUDGET]] == [True] * BUDGET
    runs = forced_runs(steps)  # a block the model opens later is closed at once: the budget is spent
    assert runs and runs[0][0]["index"] == BUDGET and len(runs[0]) > 1
    assert all("".join(s["piece"] for s in run) == "</think>" for run in runs)

    # The chat: the blocks' counts and shares are the engine's; the stats say the budget ended it.
    blocks = answer.locator("details.reasoning")
    expect(blocks).to_have_count(len(runs))
    notes = blocks.locator(".reasoning-note")
    share = math.floor(100 * BUDGET / stats["num_generated_tokens"] + 0.5)  # JS Math.round: halves go up
    expect(notes.first).to_have_text(f"thinking: {BUDGET} tokens, {share}% of the answer")
    for n in range(1, len(runs)):
        expect(notes.nth(n)).to_have_text("thinking: 0 tokens, 0% of the answer")
    block = blocks.first
    expect(answer.locator(".msg-stats")).to_contain_text(f"{BUDGET} thinking tok")
    expect(answer.locator(".msg-stats .thinking-budget")).to_have_text("thinking budget ended thinking")

    # Its tokens are hoverable, with the probabilities the engine reported.
    if block.get_attribute("open") is None:  # a block seen open while streaming stays open
        block.locator("summary").click()
    expect(block).to_have_attribute("open", "")
    token = block.locator(".tok").first
    step = steps[int(token.get_attribute("data-step"))]
    assert step["is_reasoning"]
    token.hover()
    popover = page.locator("#token-popover")
    expect(popover.locator(".popover-head .piece")).to_have_text(visible_piece(step["piece"]))
    expect(popover.locator(".popover-meta")).to_contain_text(f"p {fmt_prob(math.exp(step['raw_logprob']))} raw")
    page.screenshot(path=str(screenshot_dir / "chat-thinking-budget.png"))
    page.mouse.move(700, 850)

    # The next turn: R1's template drops the earlier reasoning, and the prompt view says so.
    reasoning_text = events(page, "generation.finished")[-1]["text"].split("</think>")[0].strip()
    send(page, "And 3+3?")
    expect(page.locator(".msg-assistant .finish")).to_have_count(2)
    prompt = events(page, "generation.started")[-1]["prompt"]
    assert prompt["dropped_reasoning"] and (not reasoning_text or reasoning_text not in prompt["text"])
    page.locator(".msg-assistant").last.locator(".prompt-btn").click()
    dialog = page.locator("#prompt-dialog")
    expect(dialog.locator(".dropped-reasoning")).to_contain_text("dropped the reasoning of 1 earlier answer")
    page.screenshot(path=str(screenshot_dir / "chat-thinking-prompt.png"))


def forced_runs(steps: list[dict]) -> list[list[dict]]:
    """The forced steps in runs of consecutive indices (one `</think>` each)."""
    runs: list[list[dict]] = []
    for step in (s for s in steps if s["is_forced"]):
        if runs and runs[-1][-1]["index"] == step["index"] - 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return runs


def fmt_prob(prob: float) -> str:
    """Mirror of static/js/format.js fmtProb."""
    if 0 < prob < 0.001:
        return "<0.1%"
    return f"{prob * 100:.{0 if prob >= 0.995 or prob == 0 else 1}f}%"
