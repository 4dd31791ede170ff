// One chat message on screen. Owns: the DOM of user and assistant messages, streaming
// updates, an answer's compact line (its numbers, finish reason, Regenerate / Copy / Prompt
// and the Details switch) and its details (the surprise strip, every stat, how it was served,
// drawn by serving.js, the step exports; a beam search's beams by chat_beams.js), and the
// in-place editor. State changes (sending, stopping) belong to chat.js, which passes the
// `actions` callbacks in.
import { beamsPanel } from "./chat_beams.js";
import { h } from "./dom.js";
import { cutCharacterBytes, errorText, finishReasonLabel, fmtMs, fmtNum } from "./format.js";
import { icon } from "./icons.js";
import { thumbnails } from "./image_attach.js";
import { charTokensFromSteps, renderAnswer } from "./markdown.js";
import { reasoningNotes } from "./reasoning_stats.js";
import { newRun } from "./run_state.js";
import { isDisaggregated, servingView } from "./serving.js";
import { speculationStatsText } from "./speculation.js";
import { promptSummary, surpriseStrip } from "./surprise.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

/** An assistant message as the page tracks it: a run (run_state.js: what its generation's events
 * say) with the message's own fields and the page's view state. */
export function newAssistantMessage(fields = {}) {
  return newRun({ role: "assistant", id: null, content: "", isStreaming: false, openReasoning: new Set(),
    promptPerplexity: null, isBeamsOpen: false, isDetailsOpen: false, ...fields });
}

/** Whether an ended answer's token steps miss some (its stats count every generated token). */
export function isMissingSteps(message) {
  const expected = message.stats?.num_generated_tokens;
  return !message.beamSteps.length && expected != null && message.steps.length < expected;
}

/** The step with `index` (steps arrive in order, so this is normally `steps[index]`). */
export function stepAt(steps, index) {
  return steps[index]?.index === index ? steps[index] : steps.find((s) => s.index === index) ?? null;
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
      h("button", { class: "icon-btn edit-btn", type: "button", title: gettext("Edit and resend"), "aria-label": gettext("Edit message"),
        onclick: () => openEditor(message, actions) }, icon("edit", 15))));
}

function openEditor(message, actions) {
  const bubble = message.el.querySelector(".bubble");
  if (!bubble || !actions.canEdit(message)) return;  // no bubble: the editor is already open
  const textarea = h("textarea", { class: "textarea", rows: 3, "aria-label": gettext("Edit message") });
  textarea.value = message.content;
  const editor = h("div", { class: "msg-edit" }, textarea,
    h("div", { class: "actions" },
      h("button", { class: "btn small", type: "button", onclick: () => editor.replaceWith(bubble) }, gettext("Cancel")),
      h("button", { class: "btn primary small", type: "button",
        onclick: () => { const content = textarea.value.trim(); if (content) actions.edit(message, content); } }, gettext("Save & send"))));
  bubble.replaceWith(editor);
  textarea.focus();
}

function assistantElement(message, actions) {
  const body = h("div", { class: "msg-body" });
  body.addEventListener("pointerenter", () => actions.ensureSteps(message), { once: true });
  const details = h("div", { class: "msg-details", hidden: true },
    h("div", { class: "msg-strip" }),
    h("div", { class: "msg-stats" }),
    h("div", { class: "msg-serving" }),
    h("div", { class: "msg-actions export-row" },
      ...["json", "csv"].map((fmt) => h("a", { class: `btn ghost small export-btn export-${fmt}`, download: "",
        title: interpolate(gettext("every step record of this answer as %(format)s"), { format: fmt.toUpperCase() }) },
      icon("download", 14), interpolate(gettext("Steps %(format)s"), { format: fmt.toUpperCase() })))));
  const iconButton = (cls, name, label, onclick) => h("button", { class: `btn ghost small icon-only ${cls}`, type: "button",
    title: label, "aria-label": label, onclick }, icon(name, 15));
  return h("div", { class: "msg msg-assistant", dataset: { role: "assistant" } },
    h("div", { class: "msg-head" }, h("span", { class: "avatar" }, "AI"), h("span", { class: "model-name" }, message.modelName || gettext("Assistant"))),
    body,
    h("div", { class: "msg-beams" }),
    h("div", { class: "alert msg-error", hidden: true, role: "alert" }),
    h("div", { class: "msg-foot" },
      h("span", { class: "msg-summary muted small" }),
      h("span", { class: "msg-finish" }),
      h("span", { class: "msg-actions" },
        iconButton("regenerate-btn", "refresh", gettext("Regenerate: answer again. Under a greedy preset this samples "
          + "(temperature 0.8): greedy would repeat the same answer."), () => actions.regenerate(message)),
        iconButton("copy-btn", "copy", gettext("Copy the answer"), (e) => copyText(e.currentTarget, message)),
        iconButton("prompt-btn", "code", gettext("Show the prompt sent to the model"), () => actions.showPrompt(message)),
        h("button", { class: "btn ghost small details-btn", type: "button", "aria-expanded": "false",
          title: gettext("the surprise per token, every number, how it was served, the step records"),
          onclick: () => { message.isDetailsOpen = !message.isDetailsOpen; updateAssistant(message); } },
        gettext("Details"), icon("chevron", 14)))),
    details);
}

async function copyText(button, message) {
  const label = button.getAttribute("aria-label");
  let isCopied;
  try {
    await navigator.clipboard.writeText(message.content || message.text);
    isCopied = true;
  } catch {
    isCopied = false;
  }
  const done = isCopied ? gettext("Copied") : gettext("Copy failed");
  button.title = done;
  button.setAttribute("aria-label", done);
  button.replaceChildren(icon(isCopied ? "check" : "x", 15));
  setTimeout(() => { button.title = label; button.setAttribute("aria-label", label); button.replaceChildren(icon("copy", 15)); }, 1500);
}

/**
 * The answer's text as shown: a generation that ended inside a multi-byte character (max tokens,
 * a stop) ends its text with U+FFFD; that half character is left out and said so instead.
 * -> {text, cutBytes: the held-back bytes as "0xF0 0x9F", or null}
 */
export function withoutCutCharacter(message, text) {
  const reason = message.isStreaming ? null : message.stats?.finish_reason;
  if (!text.endsWith("\ufffd")) return { text, cutBytes: null };
  // An older answer whose steps are not loaded yet: its text alone says it was cut.
  const last = message.steps.at(-1) ?? { text_delta: text };
  const bytes = cutCharacterBytes(last, reason);
  return bytes === null ? { text, cutBytes: null } : { text: text.replace(/\ufffd+$/, ""), cutBytes: bytes };
}

/** Redraw an assistant message's body, error, compact line, details and buttons from its state. */
export function updateAssistant(message) {
  const el = message.el;
  const body = el.querySelector(".msg-body");
  const { text, cutBytes } = withoutCutCharacter(message, message.isStreaming ? message.text : message.content);
  const charTokens = message.steps.length ? charTokensFromSteps(message.steps) : null;
  const notes = reasoningNotes(message.steps, message.segments ?? [], message.stats);
  renderAnswer(body, text, charTokens, message.openReasoning, message.segments, notes);
  colourTokens(body, message.steps);
  body.classList.toggle("streaming", message.isStreaming);
  const error = el.querySelector(".msg-error");
  error.hidden = !message.error;
  error.textContent = message.error ? errorText(message.error) : "";
  el.querySelector(".msg-beams").replaceChildren(...[beamsPanel(message)].filter(Boolean));
  el.querySelector(".msg-summary").replaceChildren(...summaryLine(message, cutBytes));
  const reason = message.stats?.finish_reason;
  el.querySelector(".msg-finish").replaceChildren(
    ...(reason ? [h("span", { class: `badge finish finish-${reason}`, title: gettext("finish reason") }, finishReasonLabel(reason))] : []));
  el.querySelector(".model-name").textContent = message.modelName || gettext("Assistant");
  for (const btn of el.querySelectorAll(".regenerate-btn, .copy-btn")) btn.hidden = message.isStreaming;
  el.querySelector(".prompt-btn").hidden = !message.prompt && !message.generation_id;
  const detailsBtn = el.querySelector(".details-btn");
  detailsBtn.setAttribute("aria-expanded", String(message.isDetailsOpen));
  el.classList.toggle("details-open", message.isDetailsOpen);
  const details = el.querySelector(".msg-details");
  details.hidden = !message.isDetailsOpen;
  // Drawn while closed too (cheap): the page's tests and the next open read the same numbers.
  el.querySelector(".msg-strip").replaceChildren(...stripView(message, actionsOf.get(el)));
  el.querySelector(".msg-stats").replaceChildren(...statBadges(message));
  el.querySelector(".msg-serving").replaceChildren(...servingView({ stats: message.stats, handoff: message.handoff,
    liveDecodeMs: message.handoff ? Date.now() - message.handoff.receivedAt : 0 }));
  for (const link of el.querySelectorAll(".export-btn")) {
    link.hidden = message.isStreaming || message.generation_id === null;
    link.href = `/api/generations/${message.generation_id}/steps.${link.classList.contains("export-csv") ? "csv" : "json"}`;
  }
}

/** The compact line under an answer: tokens, time to first token, speed (or the queue position). */
function summaryLine(message, cutBytes) {
  const stats = message.stats ?? liveStats(message);
  if (stats?.waiting) {
    return [h("span", { class: "waiting", title: gettext("every place in the worker's batch is taken: this request runs when one frees up") },
      stats.waiting)];
  }
  const parts = [];
  const numTokens = stats?.num_generated_tokens ?? (message.steps.length || null);
  if (numTokens != null) {
    parts.push(interpolate(ngettext("%(n)s token", "%(n)s tokens", numTokens), { n: numTokens }) + (message.isStreaming ? "…" : ""));
  }
  if (stats?.ttft_ms != null) parts.push(interpolate(gettext("first token %(time)s"), { time: fmtMs(stats.ttft_ms) }));
  else if (message.isStreaming && !message.prefilled && !message.steps.length) parts.push(gettext("waiting for the worker…"));
  if (stats?.decode_tok_s) parts.push(interpolate(gettext("%(speed)s tok/s"), { speed: fmtNum(stats.decode_tok_s, 1) }));
  if (isDisaggregated(message.stats) || message.handoff) parts.push(gettext("prefill → decode on two workers"));
  const line = [parts.join(" · ")];
  const speculation = message.isStreaming ? null : speculationStatsText(message.stats);
  if (speculation) {
    line.push(h("span", { class: "spec-stats", title: gettext("speculative decoding: proposed tokens the model accepted, and the decode's estimated speedup (from the measured step costs; the answer is the same as without)") },
      " · ", speculation.acceptance, " · ", speculation.speedup));
  }
  if (cutBytes !== null) {
    line.push(h("span", { class: "cut-note", title: gettext("the held-back bytes are not a whole UTF-8 character, so they are "
      + "left out of the text") }, " · ", cutBytes ? interpolate(gettext("ended inside a character (%(bytes)s)"), { bytes: cutBytes })
      : gettext("ended inside a character")));
  }
  return line;
}

/** The surprise strip, once the steps are here (an older answer loads them on request). Beam
 * search samples nothing, so it has none (its beams are under the answer). */
function stripView(message, actions) {
  const isBeam = message.beamSteps.length || message.steps.some((s) => s.isBeam || s.type === "beam_step")
    || message.stats?.sequences || (message.params?.num_beams ?? 1) > 1;
  if (isBeam) return [];
  if (!message.steps.length) {
    const canLoad = !message.isStreaming && message.generation_id !== null;
    return canLoad ? [h("button", { class: "btn ghost small strip-load", type: "button",
      onclick: () => actions.ensureSteps(message) }, gettext("Show surprise per token"))] : [];
  }
  return [surpriseStrip(message.steps, message.isStreaming ? null : promptPart(message, actions))];
}

/** The prompt's perplexity: asked of a worker on request, then kept on the message. */
function promptPart(message, actions) {
  const ppl = message.promptPerplexity;
  if (ppl?.value !== undefined) return promptSummary(ppl);
  if (ppl?.error) return h("span", { class: "strip-error" }, errorText(ppl.error));
  if (ppl?.isLoading) return h("span", { class: "muted" }, gettext("a worker is computing the prompt's perplexity…"));
  if (message.generation_id === null) return null;
  return h("button", { class: "btn ghost small prompt-ppl-btn", type: "button", title: gettext("a worker scores every prompt token given the ones before it (one forward pass)"),
    onclick: () => actions.promptPerplexity(message) }, gettext("Prompt perplexity"));
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
  if (!stats || stats.waiting) return [];
  const badges = [];
  const add = (title, text, extraClass = "") => badges.push(h("span", { class: `badge ${extraClass}`, title }, text));
  if (stats.queue_ms >= 1) add(gettext("time spent waiting for a place in the batch (counted in the TTFT)"), interpolate(gettext("queued %(time)s"), { time: fmtMs(stats.queue_ms) }));
  if (stats.num_prompt_tokens != null) add(gettext("tokens in the prompt"), interpolate(gettext("%(n)s prompt tok"), { n: stats.num_prompt_tokens }));
  if (stats.num_cached_tokens != null) add(gettext("prompt tokens reused from the prefix cache"), interpolate(gettext("%(n)s cached"), { n: stats.num_cached_tokens }));
  if (stats.num_prompt_tokens != null && stats.num_cached_tokens != null) {
    add(gettext("prompt tokens the prefill computed (the rest came from the prefix cache)"),
      interpolate(gettext("%(n)s prefilled"), { n: stats.num_prompt_tokens - stats.num_cached_tokens }));
  }
  if (stats.num_generated_tokens != null) add(gettext("generated tokens"), interpolate(gettext("%(n)s generated"), { n: stats.num_generated_tokens }));
  if (stats.ttft_ms != null && stats.model_load_ms) {
    add(gettext("time to first token, including the wait for the worker to load the model"),
      interpolate(gettext("TTFT %(time)s (incl. model load %(load)s)"), { time: fmtMs(stats.ttft_ms), load: fmtMs(stats.model_load_ms) }), "ttft-load");
  } else if (stats.ttft_ms != null) add(gettext("time to first token"), interpolate(gettext("TTFT %(time)s"), { time: fmtMs(stats.ttft_ms) }));
  if (stats.prefill_ms != null) add(gettext("prefill forward pass"), interpolate(gettext("prefill %(time)s"), { time: fmtMs(stats.prefill_ms) }));
  if (stats.decode_tok_s != null) add(gettext("decode speed"), `${fmtNum(stats.decode_tok_s, 1)} tok/s`);
  const speculation = speculationStatsText(message.stats);
  if (speculation) {
    add(gettext("speculative decoding: of the tokens proposed for verification, those the model kept (each the token it would have chosen itself)"),
      speculation.acceptance, "spec-acceptance");
    add(gettext("speculative decoding: what the decode's tokens would have cost as plain steps, by the measured step cost, over what they did"),
      speculation.speedup, "spec-speedup");
  }
  if (stats.num_reasoning_tokens) add(gettext("tokens generated inside <think> blocks"), interpolate(gettext("%(n)s thinking tok"), { n: stats.num_reasoning_tokens }), "thinking");
  if (stats.thinking_ended_by_budget) {
    add(gettext("after max_thinking_tokens reasoning tokens the engine forced </think>; the answer followed"),
      gettext("thinking budget ended thinking"), "thinking-budget");
  }
  return badges;
}

function liveStats(message) {
  if (message.modelLoading && !message.prefilled) {
    const load = message.modelLoading;
    return { waiting: interpolate(gettext("waiting for %(worker)s to load %(model)s: %(time)s so far"),
      { worker: load.worker, model: load.modelName, time: fmtMs(load.elapsedMs) }) };
  }
  if (message.waiting && !message.prefilled) {
    const w = message.waiting;
    return { waiting: interpolate(gettext("waiting for a place in the batch: %(position)s of %(n)s (%(time)s)"),
      { position: w.position, n: w.num_waiting, time: fmtMs(w.waited_ms) }) };
  }
  if (!message.prefilled) return null;
  return { num_prompt_tokens: message.prefilled.num_prompt_tokens, num_cached_tokens: message.prefilled.num_cached_tokens,
    prefill_ms: message.prefilled.prefill_ms, queue_ms: message.prefilled.queue_ms,
    num_generated_tokens: message.steps.length || message.beamSteps.length };
}
