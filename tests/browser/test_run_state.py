"""static/js/run_state.js, the one reducer every page builds a run from: a real chat answer's
events folded by it give the events' own values under the protocol's names, and the page shows
that state; re-sent steps are kept once; refusals, failures and a stop say how the run ended.
The chat sends the temperature the user set as set, and shows the params the server resolved."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from .ui import events, sent_commands, steps_of_last_generation

pytestmark = [pytest.mark.browser, pytest.mark.e2e]

# Folds every recorded event of one generation (conftest.RECORD_EVENTS) through the reducer.
FOLD = """async (generationId) => {
  const { newRun, reduceRun } = await import("/static/js/run_state.js");
  const run = newRun();
  for (const event of window.__events) if (event.generation_id === generationId) reduceRun(run, event);
  return run;
}"""


def test_a_chat_answer_folds_into_the_protocols_fields_and_the_page_shows_them(page):
    page.goto("/")
    expect(page.locator("#conn")).to_have_attribute("data-state", "open")
    expect(page.locator("#preset-select option")).not_to_have_count(0)
    page.fill("#ov-max-tokens", "8")
    page.fill("#ov-seed", "7")
    page.fill("#ov-temperature", "0.7")  # under the default greedy preset
    page.fill("#prompt-input", "Name a colour.")
    page.press("#prompt-input", "Enter")
    answer = page.locator(".msg-assistant").last
    expect(answer.locator(".finish")).to_be_visible()

    queued = events(page, "generation.queued")[-1]
    started = events(page, "generation.started")[-1]
    finished = events(page, "generation.finished")[-1]
    run = page.evaluate(FOLD, queued["generation_id"])
    steps = steps_of_last_generation(page)
    assert run["status"] == "finished" and run["error"] is None
    assert run["generation_id"] == queued["generation_id"]
    assert (run["conversation_id"], run["message_id"]) == (queued["conversation_id"], finished["message_id"])
    assert (run["model"], run["params"], run["prompt"], run["worker"]) == (
        started["model"],
        started["params"],
        started["prompt"],
        started["worker"],
    )
    assert run["prefilled"] == events(page, "generation.prefilled")[-1]
    assert run["steps"] == steps and [s["index"] for s in steps] == list(range(len(steps)))
    assert run["beamSteps"] == []
    assert (run["text"], run["stats"], run["finish_reason"], run["segments"]) == (
        finished["text"],
        finished["stats"],
        finished["finish_reason"],
        finished["segments"],
    )
    # The page drew the same state.
    expect(answer.locator(".msg-summary")).to_contain_text(f"{len(run['steps'])} tokens")
    expect(answer.locator(".finish")).to_have_text(run["finish_reason"])

    # The temperature went as the user set it; the server resolved it (SamplingParams.resolve_overrides)
    # into sampling, and the run keeps the params as resolved.
    sent = sent_commands(page, "generate")[-1]["overrides"]
    assert sent["temperature"] == 0.7 and "greedy" not in sent
    assert run["params"]["greedy"] is False and run["params"]["temperature"] == 0.7


# Synthetic events: what the reducer does with steps sent twice, beams, refusals and stops.
CASES = """async () => {
  const { followRun, isEnded, newRun, reduceRun } = await import("/static/js/run_state.js");
  const step = (index, text) => ({ index, token_id: index, piece: text, text_delta: text });
  const out = {};

  // A re-attached page: the snapshot's steps, then live ones that repeat some: each index once.
  const attached = newRun();
  reduceRun(attached, { type: "generation.queued", generation_id: 5, message_id: 9 });
  reduceRun(attached, { type: "generation.attached", generation_id: 5, status: "running", params: { seed: 1 },
    steps: [step(0, "A"), step(1, "b")], segments: [] });
  reduceRun(attached, { type: "generation.tokens", generation_id: 5, steps: [step(1, "X"), step(2, "c")],
    segments: [{ kind: "answer", start: 0, end: 3, is_open: true }] });
  out.attached = { indices: attached.steps.map((s) => s.index), text: attached.text, status: attached.status,
    params: attached.params, segments: attached.segments, isEnded: isEnded(attached) };

  // Beam search streams no token steps: the answer so far is the best live beam.
  const beams = newRun();
  reduceRun(beams, { type: "generation.beams", generation_id: 6, steps: [
    { index: 0, beams: [{ text: "Hi", is_finished: false }] },
    { index: 1, beams: [{ text: "Hi there", is_finished: false }] }] });
  out.beams = { text: beams.text, numBeamSteps: beams.beamSteps.length, numSteps: beams.steps.length };

  // A stop ends as cancelled; the waiting position goes once the prefill ran.
  const stopped = newRun();
  reduceRun(stopped, { type: "generation.waiting", generation_id: 7, position: 1 });
  out.waiting = stopped.waiting?.position ?? null;
  reduceRun(stopped, { type: "generation.prefilled", generation_id: 7, num_prompt_tokens: 4 });
  reduceRun(stopped, { type: "generation.finished", generation_id: 7, finish_reason: "cancelled", text: "A",
    stats: { finish_reason: "cancelled" }, segments: [] });
  out.stopped = { status: stopped.status, waiting: stopped.waiting, text: stopped.text, isEnded: isEnded(stopped) };

  // Through the socket's handlers: a refusal (nothing started) and a failure keep their code.
  const seen = [];
  const refused = newRun();
  followRun(refused, (run, type) => seen.push(type))
    .onError({ code: "invalid_params", message: "bad", isRefused: true });
  const failed = newRun();
  const handlers = followRun(failed, (run, type) => seen.push(type));
  handlers.onTokens({ type: "generation.tokens", generation_id: 8, steps: [step(0, "Q")] });
  handlers.onError({ code: "worker_lost", message: "gone", isRefused: false });
  out.refused = { status: refused.status, error: refused.error };
  out.failed = { status: failed.status, error: failed.error, text: failed.text };
  out.seen = seen;
  return out;
}"""


def test_steps_are_kept_once_and_every_ending_is_said(page):
    page.goto("/explorer/")
    out = page.evaluate(CASES)
    assert out["attached"] == {
        "indices": [0, 1, 2],
        "text": "Abc",  # the snapshot's step 1 kept, the live copy dropped
        "status": "running",
        "params": {"seed": 1},
        "segments": [{"kind": "answer", "start": 0, "end": 3, "is_open": True}],
        "isEnded": False,
    }
    assert out["beams"] == {"text": "Hi there", "numBeamSteps": 2, "numSteps": 0}
    assert out["waiting"] == 1
    assert out["stopped"] == {"status": "cancelled", "waiting": None, "text": "A", "isEnded": True}
    assert out["refused"] == {
        "status": "error",
        "error": {"code": "invalid_params", "message": "bad", "isRefused": True},
    }
    assert out["failed"] == {
        "status": "error",
        "error": {"code": "worker_lost", "message": "gone", "isRefused": False},
        "text": "Q",
    }
    assert out["seen"] == ["error", "generation.tokens", "generation.error"]
