// The A/B page (/explorer/ab/): one text, two sampling settings, both generated for real side
// by side (two `complete` requests), then aligned step by step by a worker (POST
// /api/generations/<A>/inspect/ {"view": "ab", "other_generation_id": B}, docs/inside.md).
// Owns: the two requests, their columns and stats, asking for the alignment once both ended.
// Must not know: how the KL is computed (the worker's), how the alignment is drawn (ab_view.js).
import { api, getJson } from "./api.js";
import { createSide } from "./ab_side.js";
import { createAlignment } from "./ab_view.js";
import { $, bindSlider, h, wholeNamePicker } from "./dom.js";
import { errorText, finishReasonLabel, fmtMs, fmtNum, fmtProb, isSeed, seedError, stepTexts, tokenLabel } from "./format.js";
import { followRun, isEnded, newRun } from "./run_state.js";
import { GenerationSocket, showConnection } from "./socket.js";
import { gettext, interpolate } from "./i18n.js";

const socket = new GenerationSocket({ onStatus: showConnection($("#conn")) });
const length = bindSlider("#ab-tokens", String, () => {});
const alignment = createAlignment($("#ab-alignment"));
const runs = { a: null, b: null };  // per side: its run (run_state.js) with the side's `label` and `handle`
let sides = null;
let flips = new Map();  // step index -> flipped, from the last alignment
let ticket = 0;  // the current pair of requests: answers to an older pair are dropped

function run() {
  if (isBusy() || !sides) return;
  const text = $("#ab-text").value;
  if (!text.trim()) { showError({ message: gettext("Enter some text first.") }); return; }
  const seed = $("#ab-seed").value.trim();
  if (seed !== "" && !isSeed(seed)) { showError(seedError(seed)); return; }
  $("#ab-error").hidden = true;
  // The same length and seed on both sides: only the sampling settings differ.
  const common = { max_new_tokens: Number(length.value), ...(seed === "" ? {} : { seed: Number(seed) }) };
  const current = ++ticket;
  flips = new Map();
  alignment.clear(gettext("Both runs are generating…"));
  for (const side of sides) start(side, text, common, current);
  renderControls();
}

function start(side, text, common, current) {
  const sideRun = newRun({ label: side.label, handle: null });
  runs[side.name] = sideRun;
  const isCurrent = () => current === ticket;
  const command = { command: "complete", text, chat: $("#ab-chat").checked,
    model_id: Number($("#ab-model").value) || undefined, ...side.command(common) };
  sideRun.handle = socket.start(command, followRun(sideRun, (_, type) => {
    if (!isCurrent()) return;
    if (type === "generation.tokens") renderRun(side.name);
    else if (isEnded(sideRun)) ended(current);
  }));
  renderRun(side.name);
}

/** One side ended: once both have, ask a worker to align them. */
async function ended(current) {
  renderControls();
  renderRun("a");
  renderRun("b");
  if (isBusy()) return;
  const [a, b] = [runs.a, runs.b];
  if (a.error || b.error) { alignment.clear(gettext("A run failed: there is nothing to align."), true); return; }
  alignment.clear(gettext("Asking a worker to recompute both runs…"));
  try {
    const result = await api("POST", `/api/generations/${a.handle.generationId}/inspect/`,
      { view: "ab", other_generation_id: b.handle.generationId });
    if (current !== ticket) return;
    flips = new Map(result.steps.map((s) => [s.index, s.flipped]));
    alignment.show(result);
    $("#ab-align-label").textContent = interpolate(gettext("%(steps)s steps · %(flips)s flips"),
      { steps: result.num_steps, flips: [...flips.values()].filter(Boolean).length });
    renderRun("a");
    renderRun("b");
  } catch (err) {
    if (current === ticket) alignment.clear(errorText(err), true);
  }
}

const isBusy = () => Object.values(runs).some((r) => r && !r.handle.isDone);

function renderControls() {
  $("#ab-run").hidden = isBusy();
  $("#ab-stop").hidden = !isBusy();
}

function renderRun(name) {
  const r = runs[name];
  const box = $(`#ab-${name}-run`);
  const head = h("div", { class: "ab-run-head" }, h("span", { class: "ab-side-tag" }, name.toUpperCase()),
    h("b", {}, r ? r.label : sides?.find((s) => s.name === name).label ?? ""),
    r && !r.handle.isDone ? h("span", { class: "badge" }, gettext("generating…")) : null);
  if (!r) { box.replaceChildren(head, h("p", { class: "empty" }, gettext("Not run yet."))); return; }
  // The text as the chat shows it: a character spread over tokens whole at its last one, never "�".
  const { texts, cutBytes } = stepTexts(r.steps, r.finish_reason);
  const tokens = r.steps.map((step, i) => h("span", {
    class: `step-tok${flips.get(step.index) ? " flip" : ""}`, dataset: { step: step.index, tokenId: step.token_id },
    title: interpolate(gettext("step %(step)s · id %(id)s · sampled p %(p)s"), { step: step.index, id: step.token_id, p: fmtProb(Math.exp(step.logprob)) })
      + ` · ${tokenLabel(step.piece, step.token_bytes)}`,
  }, texts[i]));
  const error = r.error ? [h("p", { class: "alert" }, errorText(r.error))] : [];
  const cut = cutBytes === null ? [] : [h("p", { class: "muted small cut-note" },
    cutBytes ? interpolate(gettext("ended inside a character (%(bytes)s)"), { bytes: cutBytes }) : gettext("ended inside a character"))];
  box.replaceChildren(head, stats(r), ...error,
    h("div", { class: "continuation", id: `ab-${name}-text` }, h("span", { class: "prompt-part" }, $("#ab-text").value), ...tokens), ...cut);
}

function stats(r) {
  const s = r.stats;
  if (!s) return h("div", { class: "step-info" }, h("span", { class: "badge" }, interpolate(gettext("%(n)s tokens"), { n: r.steps.length })));
  const badge = (text, title) => h("span", { class: "badge", title }, text);
  return h("div", { class: "step-info ab-stats" },
    badge(`${interpolate(gettext("%(n)s tokens"), { n: s.num_generated_tokens })} · ${finishReasonLabel(s.finish_reason)}`, gettext("tokens generated and why the run stopped")),
    badge(interpolate(gettext("TTFT %(time)s"), { time: fmtMs(s.ttft_ms) }), gettext("time to the first token, queue included")),
    badge(interpolate(gettext("decode %(speed)s tok/s"), { speed: fmtNum(s.decode_tok_s, 1) }), gettext("decode speed")),
    s.seed === null || s.seed === undefined ? null : badge(interpolate(gettext("seed %(seed)s"), { seed: s.seed }), gettext("the sampler's seed (greedy never draws)")));
}

function showError(error) {
  const el = $("#ab-error");
  el.textContent = errorText(error);
  el.hidden = false;
}

async function init() {
  wholeNamePicker($("#ab-model"));
  $("#ab-run").addEventListener("click", run);
  $("#ab-stop").addEventListener("click", () => Object.values(runs).forEach((r) => r?.handle.stop()));
  renderControls();
  try {
    const [models, presets] = await Promise.all([getJson("/api/models/"), getJson("/api/presets/")]);
    const select = $("#ab-model");
    select.replaceChildren(...models.map((m) => h("option", { value: m.id }, m.name)));
    select.value = (models.find((m) => m.is_default) ?? models[0])?.id ?? "";
    const sampled = presets.filter((p) => p.params.num_beams === 1);  // beam search keeps no single path
    const named = (name) => sampled.find((p) => p.name === name) ?? null;
    sides = [createSide("a", sampled, named("Greedy")), createSide("b", sampled, named("Creative"))];
  } catch (err) {
    showError(err);
  }
  renderRun("a");
  renderRun("b");
}

init();
