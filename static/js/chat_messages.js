// One chat message on screen. Owns: the DOM of user and assistant messages, streaming
// updates, per-message stats (and how it was served, drawn by serving.js; a beam search's
// beams by chat_beams.js) and the in-place editor. State changes (sending, stopping) belong to chat.js, which passes the `actions`
// callbacks in.
import { beamsPanel } from "./chat_beams.js";
import { h } from "./dom.js";
import { errorText, fmtMs, fmtNum } from "./format.js";
import { icon } from "./icons.js";
import { thumbnails } from "./image_attach.js";
import { charTokensFromSteps, renderAnswer } from "./markdown.js";
import { reasoningNotes } from "./reasoning_stats.js";
import { servingView } from "./serving.js";
import { promptSummary, surpriseStrip } from "./surprise.js";

/** An assistant message as the page tracks it (server fields plus streaming state). */
export function newAssistantMessage(fields = {}) {
  return { role: "assistant", id: null, content: "", generation_id: null, stats: null, steps: [],
    prompt: null, prefilled: null, handoff: null, isStreaming: false, error: null, openReasoning: new Set(), segments: [],
    promptPerplexity: null, beamSteps: [], isBeamsOpen: false, ...fields };
}

/** The step with `index` (steps arrive in order, so this is normally `steps[index]`). */
export function stepAt(steps, index) {
  return steps[index]?.index === index ? steps[index] : steps.find((s) => s.index === index) ?? null;
}

/** The answer so far: the streamed tokens' text, or a beam search's best live beam. */
export function streamedText(message) {
  if (message.beamSteps.length && !message.steps.length) return message.beamSteps.at(-1).beams[0]?.text ?? "";
  return message.steps.map((s) => s.text_delta).join("");
}

const actionsOf = new WeakMap();  // an assistant message's element -> the callbacks its buttons call

export function renderMessage(message, actions) {
  message.el = message.role === "user" ? userElement(message, actions) : assistantElement(message, actions);
  actionsOf.set(message.el, actions);
  if (message.role === "assistant") updateAssistant(message);
  return message.el;
}

function userElement(message, actions) {
  return h("div", { class: "msg msg-user", dataset: { role: "user" } },
    message.images?.length ? thumbnails(message.images) : null,
    h("div", { class: "bubble" }, message.content),
    h("div", { class: "msg-actions" },
      h("button", { class: "icon-btn edit-btn", type: "button", title: "Edit and resend", "aria-label": "Edit message",
        onclick: () => openEditor(message, actions) }, icon("edit", 15))));
}

function openEditor(message, actions) {
  const bubble = message.el.querySelector(".bubble");
  if (!bubble || !actions.canEdit(message)) return;  // no bubble: the editor is already open
  const textarea = h("textarea", { class: "textarea", rows: 3, "aria-label": "Edit message" });
  textarea.value = message.content;
  const editor = h("div", { class: "msg-edit" }, textarea,
    h("div", { class: "actions" },
      h("button", { class: "btn small", type: "button", onclick: () => editor.replaceWith(bubble) }, "Cancel"),
      h("button", { class: "btn primary small", type: "button",
        onclick: () => { const content = textarea.value.trim(); if (content) actions.edit(message, content); } }, "Save & send")));
  bubble.replaceWith(editor);
  textarea.focus();
}

function assistantElement(message, actions) {
  const body = h("div", { class: "msg-body" });
  body.addEventListener("pointerenter", () => actions.ensureSteps(message), { once: true });
  return h("div", { class: "msg msg-assistant", dataset: { role: "assistant" } },
    h("div", { class: "msg-head" }, h("span", { class: "avatar" }, "AI"), h("span", { class: "model-name" }, message.modelName || "Assistant")),
    body,
    h("div", { class: "msg-strip" }),
    h("div", { class: "msg-beams" }),
    h("div", { class: "alert msg-error", hidden: true, role: "alert" }),
    h("div", { class: "msg-stats" }),
    h("div", { class: "msg-serving" }),
    h("div", { class: "msg-actions" },
      h("button", { class: "btn ghost small prompt-btn", type: "button", onclick: () => actions.showPrompt(message) }, icon("code", 14), "Show prompt"),
      h("button", { class: "btn ghost small regenerate-btn", type: "button", onclick: () => actions.regenerate(message),
        title: "Answer again. Under a greedy preset this samples (temperature 0.8): greedy would repeat the same answer." },
      icon("refresh", 14), "Regenerate"),
      h("button", { class: "btn ghost small copy-btn", type: "button", onclick: (e) => copyText(e.currentTarget, message) }, icon("copy", 14), "Copy"),
      ...["json", "csv"].map((fmt) => h("a", { class: `btn ghost small export-btn export-${fmt}`, download: "",
        title: `every step record of this answer as ${fmt.toUpperCase()}` }, icon("download", 14), `Steps ${fmt.toUpperCase()}`))));
}

async function copyText(button, message) {
  try {
    await navigator.clipboard.writeText(message.content || streamedText(message));
    button.lastChild.textContent = "Copied";
  } catch {
    button.lastChild.textContent = "Copy failed";
  }
  setTimeout(() => { button.lastChild.textContent = "Copy"; }, 1500);
}

/** Redraw an assistant message's body, error, stats and buttons from its state. */
export function updateAssistant(message) {
  const el = message.el;
  const body = el.querySelector(".msg-body");
  const text = message.isStreaming ? streamedText(message) : message.content;
  const charTokens = message.steps.length ? charTokensFromSteps(message.steps) : null;
  const notes = reasoningNotes(message.steps, message.segments ?? [], message.stats);
  renderAnswer(body, text, charTokens, message.openReasoning, message.segments, notes);
  colourTokens(body, message.steps);
  body.classList.toggle("streaming", message.isStreaming);
  const error = el.querySelector(".msg-error");
  error.hidden = !message.error;
  error.textContent = message.error ? errorText(message.error) : "";
  el.querySelector(".msg-strip").replaceChildren(...stripView(message, actionsOf.get(el)));
  el.querySelector(".msg-beams").replaceChildren(...[beamsPanel(message)].filter(Boolean));
  el.querySelector(".msg-stats").replaceChildren(...statBadges(message));
  el.querySelector(".msg-serving").replaceChildren(...servingView({ stats: message.stats, handoff: message.handoff,
    liveDecodeMs: message.handoff ? Date.now() - message.handoff.receivedAt : 0 }));
  el.querySelector(".model-name").textContent = message.modelName || "Assistant";
  for (const btn of el.querySelectorAll(".regenerate-btn, .copy-btn")) btn.hidden = message.isStreaming;
  for (const link of el.querySelectorAll(".export-btn")) {
    link.hidden = message.isStreaming || message.generation_id === null;
    link.href = `/api/generations/${message.generation_id}/steps.${link.classList.contains("export-csv") ? "csv" : "json"}`;
  }
  el.querySelector(".prompt-btn").hidden = !message.prompt && !message.generation_id;
}

/** The surprise strip, once the steps are here (an older answer loads them on request). */
function stripView(message, actions) {
  if (message.steps.some((s) => s.type === "beam_step")) return [];
  if (!message.steps.length) {
    const canLoad = !message.isStreaming && message.generation_id !== null;
    return canLoad ? [h("button", { class: "btn ghost small strip-load", type: "button",
      onclick: () => actions.ensureSteps(message) }, "Show surprise per token")] : [];
  }
  return [surpriseStrip(message.steps, message.isStreaming ? null : promptPart(message, actions))];
}

/** The prompt's perplexity: asked of a worker on request, then kept on the message. */
function promptPart(message, actions) {
  const ppl = message.promptPerplexity;
  if (ppl?.value !== undefined) return promptSummary(ppl);
  if (ppl?.error) return h("span", { class: "strip-error" }, errorText(ppl.error));
  if (ppl?.isLoading) return h("span", { class: "muted" }, "a worker is computing the prompt's perplexity…");
  if (message.generation_id === null) return null;
  return h("button", { class: "btn ghost small prompt-ppl-btn", type: "button", title: "a worker scores every prompt token "
    + "given the ones before it (one forward pass)", onclick: () => actions.promptPerplexity(message) }, "Prompt perplexity");
}

const pendingUpdates = new Set();

/** `updateAssistant` at most once per animation frame per message, for streaming. */
export function scheduleUpdate(message) {
  if (!pendingUpdates.size) {
    requestAnimationFrame(() => {
      for (const m of pendingUpdates) updateAssistant(m);
      pendingUpdates.clear();
    });
  }
  pendingUpdates.add(message);
}

/** Give each token span its chosen-token probability (raw; along the beam under beam search)
 * as `--p`, for the colour toggle. */
function colourTokens(body, steps) {
  for (const span of body.querySelectorAll(".tok")) {
    const step = stepAt(steps, Number(span.dataset.step));
    if (step) span.style.setProperty("--p", Math.exp(step.isBeam ? step.logprob : step.raw_logprob).toFixed(3));
  }
}

function statBadges(message) {
  const stats = message.stats ?? liveStats(message);
  if (!stats) return [];
  const badges = [];
  const add = (title, text, extraClass = "") => badges.push(h("span", { class: `badge ${extraClass}`, title }, text));
  if (stats.waiting) add("every place in the worker's batch is taken: this request runs when one frees up", stats.waiting, "waiting");
  if (stats.queue_ms >= 1) add("time spent waiting for a place in the batch (counted in the TTFT)", `queued ${fmtMs(stats.queue_ms)}`);
  if (stats.num_prompt_tokens != null) add("tokens in the prompt", `${stats.num_prompt_tokens} prompt tok`);
  if (stats.num_cached_tokens != null) add("prompt tokens reused from the prefix cache", `${stats.num_cached_tokens} cached`);
  if (stats.num_prompt_tokens != null && stats.num_cached_tokens != null) {
    add("prompt tokens the prefill computed (the rest came from the prefix cache)",
      `${stats.num_prompt_tokens - stats.num_cached_tokens} prefilled`);
  }
  if (stats.num_generated_tokens != null) add("generated tokens", `${stats.num_generated_tokens} generated`);
  if (stats.ttft_ms != null && stats.model_load_ms) {
    add("time to first token, including the wait for the worker to load the model", `TTFT ${fmtMs(stats.ttft_ms)} `
      + `(incl. model load ${fmtMs(stats.model_load_ms)})`, "ttft-load");
  } else if (stats.ttft_ms != null) add("time to first token", `TTFT ${fmtMs(stats.ttft_ms)}`);
  if (stats.prefill_ms != null) add("prefill forward pass", `prefill ${fmtMs(stats.prefill_ms)}`);
  if (stats.decode_tok_s != null) add("decode speed", `${fmtNum(stats.decode_tok_s, 1)} tok/s`);
  if (stats.num_reasoning_tokens) add("tokens generated inside <think> blocks", `${stats.num_reasoning_tokens} thinking tok`, "thinking");
  if (stats.thinking_ended_by_budget) {
    add("after max_thinking_tokens reasoning tokens the engine forced </think>; the answer followed",
      "thinking budget ended thinking", "thinking-budget");
  }
  if (stats.finish_reason) add("finish reason", stats.finish_reason, `finish finish-${stats.finish_reason}`);
  return badges;
}

function liveStats(message) {
  if (message.modelLoading && !message.prefilled) {
    const load = message.modelLoading;
    return { waiting: `waiting for ${load.worker} to load ${load.modelName}: ${fmtMs(load.elapsedMs)} so far` };
  }
  if (message.waiting && !message.prefilled) {
    const w = message.waiting;
    return { waiting: `waiting for a place in the batch: ${w.position} of ${w.num_waiting} (${fmtMs(w.waited_ms)})` };
  }
  if (!message.prefilled) return null;
  return { num_prompt_tokens: message.prefilled.num_prompt_tokens, num_cached_tokens: message.prefilled.num_cached_tokens,
    prefill_ms: message.prefilled.prefill_ms, queue_ms: message.prefilled.queue_ms,
    num_generated_tokens: message.steps.length || message.beamSteps.length };
}
