// The token-probability explorer (/explorer/). Owns: the chosen token path (steps), the
// requests that extend it (`complete` with `token_ids`, cache and PD switches), branching,
// and redrawing the panels when steps, the selected step or the sliders change.
import { getJson } from "./api.js";
import { createBeamCharts, updateBeamCharts } from "./beam_charts.js";
import { beamTree } from "./beam_tree.js";
import { $, bindSlider, h } from "./dom.js";
import { createDistributionChart, createStepCharts, updateDistributionChart, updateStepCharts } from "./explorer_charts.js";
import { flatNote } from "./flat_note.js";
import { SETTING_FORMATS, errorText, fmtBytes, fmtMs, fmtNum, fmtProb, tokenLabel, visiblePiece } from "./format.js";
import { pipelineStrip } from "./pipeline_strip.js";
import { createInside } from "./inside.js";
import { renderMoeLive } from "./moe_live.js";
import { promptView } from "./prompt_view.js";
import { ImageAttachments } from "./image_attach.js";
import { processedProbs } from "./sampling.js";
import { servingView } from "./serving.js";
import { ModelStatus } from "./model_status.js";
import { GenerationSocket, showConnection } from "./socket.js";
import { promptPerplexity, promptSummary, surpriseStrip } from "./surprise.js";

const state = {
  steps: [],          // the chosen path; steps[i].index === i
  selected: null,     // index of the step shown in the distribution panel
  handle: null,
  prompt: null,       // the last generation.started `prompt`
  model: null,        // the last generation.started `model`
  params: null,       // the last generation.started `params`
  prefilled: null,    // the last generation.prefilled event
  handoff: null,      // the last request's generation.handoff (PD), with `receivedAt`
  stats: null,        // the last request's finished stats
  beamSteps: [],
  beamSequences: [],  // a finished beam search's returned sequences, best first
  generationId: null, // the last finished request: its row holds the whole path (inspections)
  numSent: 0,         // tokens of the path the last request sent after the text
  promptPerplexity: null, // the text's perplexity ({value, ...}, {isLoading} or {error}) for generationId
  textLastPiece: null, // the text's last token: what the model read before step 0
};

const modelStatus = new ModelStatus($("#ex-model"));
const socket = new GenerationSocket({ onStatus: showConnection($("#conn")), onWorkerModel: (e) => modelStatus.onWorkerModel(e) });
const sliderOutputs = [];  // each slider's "show its value" function: one slider can change another's text
// Temperature 0 is greedy: the filters after it then choose nothing, and say so.
const unlessGreedy = (format) => (v) => (Number($("#ex-temperature").value) === 0 ? "n/a (greedy)" : format(v));
const sliders = {
  temperature: slider("#ex-temperature", SETTING_FORMATS.temperature),
  top_k: slider("#ex-top-k", unlessGreedy(SETTING_FORMATS.top_k)),
  top_p: slider("#ex-top-p", unlessGreedy(SETTING_FORMATS.top_p)),
  min_p: slider("#ex-min-p", unlessGreedy(SETTING_FORMATS.min_p)),
  num_alternatives: slider("#ex-alternatives", String),
  run_length: slider("#ex-run-length", String),
};
// The prompt's images go before its text, with every request (the prefix cache knows them by content).
const attachments = new ImageAttachments({ form: $(".explorer-controls"), input: $("#ex-text"), tray: $("#ex-image-tray"),
  button: $("#ex-attach"), onError: (message) => showError({ message }),
  onChange: () => { if (state.steps.length || state.prompt) reset(); } });
const distChart = createDistributionChart($("#dist-chart"), (alt) => branch(state.selected, alt));
const inside = createInside({
  root: $("#ex-inside"),
  getTarget: () => (isBusy() || state.generationId === null || state.selected === null || state.beamSteps.length ? null
    : { generationId: state.generationId, step: state.selected, params: inspectParams() }),
  onBranch: (index, alt) => branch(index, alt),
  onExact: () => renderDistribution(),
});
const stepCharts = createStepCharts({
  prob: $("#prob-chart"), entropy: $("#entropy-chart"), latency: $("#latency-chart"), kv: $("#kv-chart"),
}, selectStep);
const beamCharts = createBeamCharts({
  score: $("#beam-score-chart"), beams: $("#beam-count-chart"), latency: $("#beam-latency-chart"),
});

function slider(selector, format) {
  const output = $(`${selector}-value`);
  sliderOutputs.push(() => { output.textContent = format(Number($(selector).value)); });
  return bindSlider(selector, format, () => { for (const show of sliderOutputs) show(); renderDistribution(); });
}

function samplingParams() {
  return {
    temperature: Number(sliders.temperature.value),
    top_k: Number(sliders.top_k.value),
    top_p: Number(sliders.top_p.value),
    min_p: Number(sliders.min_p.value),
  };
}

/** The sliders as an inspection changes them (the explorer's requests run without repetition penalty). */
function inspectParams() {
  const seed = $("#ex-seed").value.trim();
  return { ...samplingParams(), greedy: false, repetition_penalty: 1.0, seed: /^\d+$/.test(seed) ? Number(seed) : null };
}

// ---------- requests ----------

function request(maxNewTokens) {
  if (isBusy()) return;
  const text = $("#ex-text").value;
  if (!text.trim()) { showError({ message: "Enter some text first." }); return; }
  const numBeams = Number($("#ex-beams").value);
  // The sliders are the whole sampling setting (temperature 0 is greedy), whatever the default preset says.
  const overrides = { ...samplingParams(), greedy: false, repetition_penalty: 1.0, max_new_tokens: maxNewTokens,
    num_alternatives: Number(sliders.num_alternatives.value),
    use_kv_cache: $("#ex-kv-cache").checked, use_prefix_cache: $("#ex-prefix-cache").checked };
  const seed = $("#ex-seed").value.trim();
  if (seed !== "") {
    if (!/^\d+$/.test(seed)) { showError({ message: `Seed "${seed}" must be a whole number.` }); return; }
    overrides.seed = Number(seed);
  }
  if (numBeams > 1) Object.assign(overrides, { num_beams: numBeams, num_return_sequences: numBeams });
  const base = state.steps.length;
  if (numBeams > 1) { state.beamSteps = []; state.beamSequences = []; renderBeams(); }
  hideError();
  Object.assign(state, { prefilled: null, handoff: null, stats: null });
  // Events from a request that Reset abandoned must not touch the new state.
  const isCurrent = () => state.handle === handle;
  let isHandoffUnmarked = false;  // the next step is the decode worker's first
  const command = {
    command: "complete", text, chat: $("#ex-chat").checked, token_ids: state.steps.map((s) => s.token_id),
    model_id: Number($("#ex-model").value) || undefined, overrides,
  };
  const images = attachments.current();
  if (images.length) command.images = images;
  if ($("#ex-pd").checked) command.pd = true;  // absent: the server's mode applies
  const handle = socket.start(command, {
    onStarted: (event) => {
      if (!isCurrent()) return;
      Object.assign(state, { prompt: event.prompt, model: event.model, params: event.params,
        textLastPiece: event.prompt?.tokens?.at(-1 - base)?.piece ?? null });
      inside.setModel(event.model);
      renderPipeline();
    },
    onPrefilled: (event) => {
      if (!isCurrent()) return;
      state.prefilled = event;
      renderTokenization();
      renderServing();
    },
    onHandoff: (event) => {
      if (!isCurrent()) return;
      state.handoff = { ...event, receivedAt: Date.now() };
      isHandoffUnmarked = true;
      renderServing();
    },
    onTokens: (event) => {
      if (!isCurrent()) return;
      for (const step of event.steps) {
        state.steps.push({ ...step, index: base + step.index, isAfterHandoff: isHandoffUnmarked });
        isHandoffUnmarked = false;
      }
      state.selected = state.steps.length - 1;
      renderAll();
    },
    onBeams: (event) => {
      if (!isCurrent()) return;
      state.beamSteps.push(...event.steps);
      renderBeams();
    },
    onFinished: (event) => {
      if (isCurrent()) {
        // promptPerplexity stays: every request of the path starts with the same text.
        Object.assign(state, { stats: event.stats, generationId: handle.generationId, numSent: base });
        renderDistribution();  // now the worker can answer with the exact processed distribution
        if (numBeams > 1) { state.beamSequences = event.stats?.sequences ?? []; renderBeams(); }
        renderServing();
      }
      renderControls();
      renderPipeline();
      renderStrip();
    },
    onError: (error) => {
      if (isCurrent()) showError(error);
      renderControls();
      renderPipeline();
    },
  });
  state.handle = handle;
  renderControls();
  renderPipeline();
  renderServing();
}

/** Take `alt` instead of the token chosen at step `index`, drop what followed, continue. */
function branch(index, alt) {
  if (index === null || isBusy()) return;
  const step = state.steps[index];
  if (alt.token_id === step.token_id && index === state.steps.length - 1) return;
  const processed = step.top_processed.find((a) => a.token_id === alt.token_id);
  state.steps = state.steps.slice(0, index);
  state.steps.push({
    ...step, token_id: alt.token_id, piece: alt.piece, text_delta: alt.piece, token_bytes: "",
    raw_logprob: alt.logprob, logprob: processed ? processed.logprob : -Infinity,
    rank: step.top_raw.findIndex((a) => a.token_id === alt.token_id) + 1, isBranched: true, isAfterHandoff: false,
  });
  state.selected = index;
  renderAll();
  request(1);
}

function selectStep(index) {
  state.selected = index;
  renderContinuation();
  renderDistribution();
  renderPipeline();
}

function reset() {
  state.handle?.stop();
  Object.assign(state, { steps: [], selected: null, handle: null, prompt: null, prefilled: null, handoff: null,
    stats: null, beamSteps: [], beamSequences: [], generationId: null, numSent: 0, promptPerplexity: null });
  inside.setModel(null);  // another model may be chosen: offered again once a request has started
  renderAll();
  renderBeams();
  renderControls();
  renderServing();
}

const isBusy = () => state.handle !== null && !state.handle.isDone;

// ---------- rendering ----------

function renderAll() {
  renderContinuation();
  renderDistribution();
  updateStepCharts(stepCharts, state.steps);
  renderMoeLive($("#ex-moe-live"), state.model, state.steps, state.textLastPiece);
  $("#ex-handoff-legend").hidden = !state.steps.some((s) => s.isAfterHandoff);
  renderTokenization();
  renderPipeline();
  if (state.handoff) renderServing();  // the decode segment grows with the tokens
}

/** The phase the strip highlights: a request still waiting for its first token is in prefill. */
function currentPhase() {
  if (isBusy() && !state.prefilled) return "prefill";
  return state.selected === null ? null : state.steps[state.selected]?.phase ?? null;
}

function renderPipeline() {
  const model = state.model;
  $("#ex-model-label").textContent = model ? model.name ?? model.architecture : "its details come with the first request";
  $("#ex-pipeline").replaceChildren(pipelineStrip({
    model, params: state.params, phase: currentPhase(),
    numPromptTokens: state.prefilled?.num_prompt_tokens ?? state.prompt?.tokens?.length ?? null,
    numPrefilledTokens: state.prefilled?.num_prefilled_tokens ?? null,
  }));
}

function renderServing() {
  const p = state.prefilled;
  $("#ex-cache-label").textContent = p ? `${p.num_prompt_tokens} prompt · ${p.num_cached_tokens} cached · `
    + `${p.num_prefilled_tokens} prefilled · prefill ${fmtMs(p.prefill_ms)}` : "";
  const views = servingView({ stats: state.stats, handoff: state.handoff,
    liveDecodeMs: state.handoff ? Date.now() - state.handoff.receivedAt : 0 });
  const empty = isBusy() ? "Running…" : "After a request: which worker ran it (or the prefill → decode handoff) and its prefix cache.";
  $("#ex-serving").replaceChildren(...(views.length ? views : [h("p", { class: "empty" }, empty)]));
}

function renderControls() {
  const busy = isBusy();
  const isBeam = Number($("#ex-beams").value) > 1;
  $("#ex-step").disabled = busy || isBeam;
  $("#ex-run").hidden = busy;
  $("#ex-stop").hidden = !busy;
}

function renderContinuation() {
  const box = $("#ex-continuation");
  const tokens = state.steps.map((step) => h("span", {
    class: `step-tok${step.index === state.selected ? " selected" : ""}${step.isBranched ? " branched" : ""}`,
    dataset: { step: step.index, tokenId: step.token_id },
    style: `--p: ${Math.exp(step.raw_logprob).toFixed(3)}`,
    title: `step ${step.index} · id ${step.token_id} · p ${fmtProb(Math.exp(step.raw_logprob))} · rank ${step.rank}`,
    onclick: () => selectStep(step.index),
  }, step.piece));
  box.replaceChildren(h("span", { class: "prompt-part" }, $("#ex-text").value), ...tokens);
  $("#ex-count").textContent = `${state.steps.length} token${state.steps.length === 1 ? "" : "s"}`;
  renderStrip();
}

/** Surprise and entropy per token, the perplexities, and the last request's step export. */
function renderStrip() {
  $("#ex-strip").replaceChildren(...(state.steps.length ? [surpriseStrip(state.steps, promptPart())] : []));
  const id = state.generationId;
  $("#ex-export").hidden = id === null || isBusy();
  $("#ex-export-json").href = `/api/generations/${id}/steps.json`;
  $("#ex-export-csv").href = `/api/generations/${id}/steps.csv`;
}

function promptPart() {
  const ppl = state.promptPerplexity;
  if (ppl?.value !== undefined) return promptSummary(ppl);
  if (ppl?.error) return h("span", { class: "strip-error" }, errorText(ppl.error));
  if (ppl?.isLoading) return h("span", { class: "muted" }, "a worker is computing the prompt's perplexity…");
  if (state.generationId === null || isBusy() || state.beamSteps.length) return null;
  return h("button", { class: "btn ghost small prompt-ppl-btn", type: "button", title: "a worker scores every token of "
    + "the prompt (the text) given the ones before it (one forward pass)", onclick: showPromptPerplexity }, "Prompt perplexity");
}

async function showPromptPerplexity() {
  const generationId = state.generationId;
  state.promptPerplexity = { isLoading: true };
  renderStrip();
  let result;
  try {
    // The last request's prompt is the text, then the tokens it sent: those are generated, not the text.
    result = await promptPerplexity(generationId, state.numSent);
  } catch (err) {
    result = { error: err };
  }
  if (state.generationId !== generationId) return;  // a newer request or Reset replaced it
  state.promptPerplexity = result;
  renderStrip();
}

function renderDistribution() {
  const step = state.selected === null ? null : state.steps[state.selected];
  // Exact from the worker when it has answered for this step and these settings; until then
  // the in-browser preview over the known top tokens, marked approximate.
  const exact = step ? inside.exactFor() : null;
  const processed = exact ?? (step ? processedProbs(step.top_raw, samplingParams()) : new Map());
  processed.isExact = exact !== null;
  if (step && !exact) scheduleExact();
  updateDistributionChart(distChart, step, processed);
  $("#ex-step-label").textContent = step ? `step ${step.index} · ${step.phase}` : "no step yet";
  $("#ex-step-info").replaceChildren(...(step ? stepBadges(step) : []));
  renderAlternatives(step, processed);
  $("#ex-flat").replaceChildren(...[step ? flatNote(step, processed) : null].filter(Boolean));
}

let exactTimer = null;
function scheduleExact() {
  clearTimeout(exactTimer);
  exactTimer = setTimeout(() => inside.refreshExact(), 250);
}

function stepBadges(step) {
  const badge = (text, title) => h("span", { class: "badge", title }, text);
  return [
    h("span", { class: "badge" }, "chosen ", h("span", { class: "piece" }, tokenLabel(step.piece, step.token_bytes)), ` id ${step.token_id}`),
    badge(`raw p ${fmtProb(Math.exp(step.raw_logprob))} · rank ${step.rank}`, "probability and rank under the model's own distribution"),
    badge(`sampled p ${fmtProb(Math.exp(step.logprob))}`, "probability under the distribution it was sampled from"),
    badge(`entropy ${fmtNum(step.entropy)} nats`),
    badge(`${fmtMs(step.latency_ms)} ${step.phase}`, "time for this step"),
    badge(`KV ${fmtBytes(step.kv_cache_bytes)}`, "KV-cache size after this step"),
    step.isBranched ? badge("branched here", "you picked this token") : null,
  ].filter(Boolean);
}

function renderAlternatives(step, processed) {
  const list = $("#ex-alternatives-list");
  if (!step) { list.replaceChildren(h("p", { class: "empty" }, "Press “Next token” to see the distribution.")); return; }
  const head = h("div", { class: "alt-row alt-head", role: "presentation" },
    h("span", {}, "#"), h("span", {}, "token"), h("span", { class: "num" }, "raw"),
    h("span", { class: "num", id: "ex-processed-head", dataset: { exact: processed.isExact },
      title: processed.isExact ? "exact: computed by the worker from the step's full logits"
        : "approximate: renormalized over these top tokens only, until the worker's exact answer arrives" },
    processed.isExact ? "processed" : "processed ≈"));
  const rows = step.top_raw.map((alt, i) => {
    const known = processed.get(alt.token_id);
    const prob = known ?? processed.below ?? 0;
    const classes = [alt.token_id === step.token_id ? "chosen" : "", prob === 0 ? "filtered" : ""].join(" ");
    return h("button", { type: "button", role: "listitem", class: `alt-row ${classes}`, dataset: { tokenId: alt.token_id },
      title: `take “${alt.piece}” (id ${alt.token_id}) here and continue`, onclick: () => branch(step.index, alt) },
      h("span", { class: "muted" }, i + 1), h("span", { class: "piece" }, visiblePiece(alt.piece)),
      h("span", { class: "num" }, fmtProb(alt.prob)),
      h("span", { class: "num processed" }, known === undefined && prob > 0 ? `< ${fmtProb(prob)}` : fmtProb(prob)));
  });
  list.replaceChildren(head, ...rows);
}

function renderTokenization() {
  const box = $("#ex-tokenization");
  if (!state.prompt) { box.replaceChildren(h("p", { class: "empty" }, "Generate a token to see how the model tokenizes the prompt.")); return; }
  box.replaceChildren(promptView(state.prompt, state.prefilled?.num_cached_tokens ?? 0));
}

function renderBeams() {
  const isBeam = Number($("#ex-beams").value) > 1;
  $("#ex-beam-section").hidden = !isBeam && !state.beamSteps.length;
  const best = state.beamSequences[0]?.token_ids ?? null;
  $("#ex-beam-label").textContent = state.beamSteps.length ? `${state.beamSteps.length} steps` : "press Run";
  $("#ex-beam-tree").replaceChildren(state.beamSteps.length ? beamTree(state.beamSteps, best)
    : h("p", { class: "empty" }, "Press “Run” to search; each column is a step, each box a live beam."));
  updateBeamCharts(beamCharts, state.beamSteps);
  const hasBeams = state.beamSteps.length > 0;  // the last request was a beam search
  $("#ex-gen-charts").hidden = hasBeams;
  $("#ex-gen-beam-note").hidden = !hasBeams;
  $("#ex-beam-results").replaceChildren(...state.beamSequences.map((seq, i) => h("p", { class: "small" },
    h("span", { class: "badge" }, i === 0 ? "best" : `#${i + 1}`), " ", h("span", { class: "mono" }, seq.text),
    h("span", { class: "muted" }, `  score ${seq.score.toFixed(3)}`))));
}

function showError(error) {
  const el = $("#ex-error");
  el.textContent = errorText(error);
  el.hidden = false;
}

function hideError() {
  $("#ex-error").hidden = true;
}

// ---------- wiring ----------

async function init() {
  $("#ex-step").addEventListener("click", () => request(1));
  $("#ex-run").addEventListener("click", () => request(Number(sliders.run_length.value)));
  $("#ex-stop").addEventListener("click", () => state.handle?.stop());
  $("#ex-reset").addEventListener("click", reset);
  $("#ex-text").addEventListener("input", () => { if (state.steps.length || state.prompt) reset(); else renderContinuation(); });
  $("#ex-chat").addEventListener("change", reset);
  $("#ex-model").addEventListener("change", reset);
  $("#ex-beams").addEventListener("change", () => { renderControls(); renderBeams(); });
  $("#ex-colorize").addEventListener("change", (e) => $("#ex-continuation").classList.toggle("colorize", e.target.checked));
  renderAll();
  renderControls();
  renderServing();
  try {
    const models = await getJson("/api/models/");
    const select = $("#ex-model");
    select.replaceChildren(...models.map((m) => h("option", { value: m.id }, m.name)));
    select.value = (models.find((m) => m.is_default) ?? models[0])?.id ?? "";
    modelStatus.setModels(models);
  } catch (err) {
    showError(err);
  }
}

init();
