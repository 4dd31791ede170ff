// The token-probability explorer (/explorer/). Owns: the chosen token path (steps), the
// requests that extend it (`complete` with `token_ids`, cache and PD switches), branching,
// and redrawing the panels when steps, the selected step or the sliders change.
import { getJson } from "./api.js";
import { createBeamCharts, updateBeamCharts } from "./beam_charts.js";
import { beamTree } from "./beam_tree.js";
import { $, bindSlider, h, wholeNamePicker } from "./dom.js";
import { createDistributionChart, createStepCharts, updateDistributionChart, updateStepCharts } from "./explorer_charts.js";
import { flatNote } from "./flat_note.js";
import { grammarField, maskView } from "./grammar.js";
import { SETTING_FORMATS, errorText, fmtBytes, fmtMs, fmtNum, fmtProb, isSeed, numSteps, phaseLabel, seedError, tokenLabel, visiblePiece } from "./format.js";
import { pipelineStrip } from "./pipeline_strip.js";
import { createInside } from "./inside.js";
import { readExplorerUrl } from "./explorer_url.js";
import { renderMoeLive } from "./moe_live.js";
import { promptView } from "./prompt_view.js";
import { ImageAttachments } from "./image_attach.js";
import { asDrawn, processedProbs } from "./sampling.js";
import { servingView } from "./serving.js";
import { passStrip, passesOf, speculationLegend, speculationSummary, verificationView } from "./speculation.js";
import { ModelStatus } from "./model_status.js";
import { followRun, newRun } from "./run_state.js";
import { GenerationSocket, showConnection } from "./socket.js";
import { promptPerplexity, promptSummary, surpriseStrip } from "./surprise.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

const state = {
  steps: [],          // the chosen path; steps[i].index === i
  selected: null,     // index of the step shown in the distribution panel
  handle: null,
  run: newRun(),      // the last request's run (run_state.js): its prompt, model, params, prefilled, handoff, stats, beams
  generationId: null, // the last finished request: its row holds the whole path (inspections)
  numSent: 0,         // tokens of the path the last request sent after the text
  promptPerplexity: null, // the text's perplexity ({value, ...}, {isLoading} or {error}) for generationId
  textLastPiece: null, // the text's last token: what the model read before step 0
};

const modelStatus = new ModelStatus($("#ex-model"));
wholeNamePicker($("#ex-model"));
const socket = new GenerationSocket({ onStatus: showConnection($("#conn")), onWorkerModel: (e) => modelStatus.onWorkerModel(e) });
const sliderOutputs = [];  // each slider's "show its value" function: one slider can change another's text
// Temperature 0 is greedy: the filters after it then choose nothing, and say so.
const unlessGreedy = (format) => (v) => (Number($("#ex-temperature").value) === 0 ? interpolate(gettext("n/a (%(method)s)"), { method: gettext("greedy") }) : format(v));
const sliders = {
  temperature: slider("#ex-temperature", SETTING_FORMATS.temperature),
  top_k: slider("#ex-top-k", unlessGreedy(SETTING_FORMATS.top_k)),
  top_p: slider("#ex-top-p", unlessGreedy(SETTING_FORMATS.top_p)),
  min_p: slider("#ex-min-p", unlessGreedy(SETTING_FORMATS.min_p)),
  // greedy keeps the penalty: it changes which token has the highest score
  repetition_penalty: slider("#ex-repetition-penalty", SETTING_FORMATS.repetition_penalty),
  num_alternatives: slider("#ex-alternatives", String),
  run_length: slider("#ex-run-length", String),
};
// The prompt's images go before its text, with every request (the prefix cache knows them by content).
const attachments = new ImageAttachments({ form: $(".explorer-controls"), input: $("#ex-text"), tray: $("#ex-image-tray"),
  button: $("#ex-attach"), onError: (message) => showError({ message }),
  onChange: () => { if (state.steps.length || state.run.prompt) reset(); } });
// A new grammar starts a new path: each request's grammar goes on from the path's tokens (`prefix_ids`).
const grammar = grammarField("ex", () => { if (state.steps.length || state.run.prompt) reset(); });
const distChart = createDistributionChart($("#dist-chart"), (alt) => branch(state.selected, alt));
const inside = createInside({
  root: $("#ex-inside"),
  getTarget: () => (isBusy() || state.generationId === null || state.selected === null || state.run.beamSteps.length ? null
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
    repetition_penalty: Number(sliders.repetition_penalty.value),
    penalize_prompt: $("#ex-penalize-prompt").checked,
  };
}

/** The speculation controls as overrides (docs/protocol.md): `speculative` or a `prediction`, and
 * `num_speculative_tokens` when k is set (empty: the engine chooses per pass). */
function speculativeOverrides() {
  const kind = $("#ex-speculative").value;
  if (kind === "off") return {};
  const overrides = {};
  if (kind === "prediction") {
    const prediction = $("#ex-prediction").value;
    if (!prediction.trim()) throw new Error(gettext("Prediction: write the text the answer is expected to repeat, or choose another kind of speculation."));
    overrides.prediction = prediction;
  } else overrides.speculative = kind;
  const k = $("#ex-spec-k").value.trim();
  if (k !== "") {
    const value = Number(k);
    if (!Number.isInteger(value) || value < 1 || value > 16) {
      $("#ex-spec-k").setAttribute("aria-invalid", "true");
      throw new Error(interpolate(gettext("Tokens per proposal: \"%(value)s\" is not a whole number from 1 to 16."), { value: k }));
    }
    overrides.num_speculative_tokens = value;
  }
  return overrides;
}

/** The sliders as an inspection changes them. */
function inspectParams() {
  const seed = $("#ex-seed").value.trim();
  return { ...samplingParams(), greedy: false, seed: isSeed(seed) ? Number(seed) : null };
}

const SETTINGS = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "penalize_prompt"];
const sameSettings = (a, b) => Boolean(a && b) && SETTINGS.every((name) => a[name] === b[name]);

// ---------- requests ----------

function request(maxNewTokens) {
  if (isBusy()) return;
  const text = $("#ex-text").value;
  if (!text.trim()) { showError({ message: gettext("Enter some text first.") }); return; }
  const numBeams = Number($("#ex-beams").value);
  // The sliders are the whole sampling setting (temperature 0 is greedy), whatever the default preset says.
  const settings = samplingParams();
  const overrides = { ...settings, greedy: false, max_new_tokens: maxNewTokens,
    num_alternatives: Number(sliders.num_alternatives.value),
    use_kv_cache: $("#ex-kv-cache").checked, use_prefix_cache: $("#ex-prefix-cache").checked };
  const seed = $("#ex-seed").value.trim();
  if (seed !== "") {
    if (!isSeed(seed)) { showError(seedError(seed)); return; }
    overrides.seed = Number(seed);
  }
  if (numBeams > 1) Object.assign(overrides, { num_beams: numBeams, num_return_sequences: numBeams });
  try {
    Object.assign(overrides, speculativeOverrides());
  } catch (err) {
    showError({ message: err.message });
    return;
  }
  let spec;
  try {
    spec = grammar.spec();
  } catch (err) {
    showError({ message: err.message });
    return;
  }
  // The path so far was written under this grammar (a new one resets it): it goes on from there.
  if (spec) overrides.grammar = { ...spec, prefix_ids: state.steps.map((s) => s.token_id) };
  const base = state.steps.length;
  hideError();
  // This request's run (run_state.js); the last one's model, params and prompt are shown until
  // its generation.started replaces them. Events of a run that Reset abandoned touch nothing shown.
  const previous = state.run;
  const run = newRun({ model: previous.model, params: previous.params, prompt: previous.prompt });
  state.run = run;
  const isCurrent = () => state.run === run;
  if (numBeams > 1 || previous.beamSteps.length) renderBeams();
  let numTaken = 0;  // the run's steps already on the path
  let isHandoffUnmarked = false;  // the next step is the decode worker's first
  const command = {
    command: "complete", text, chat: $("#ex-chat").checked, token_ids: state.steps.map((s) => s.token_id),
    model_id: Number($("#ex-model").value) || undefined, overrides,
  };
  const images = attachments.current();
  if (images.length) command.images = images;
  if ($("#ex-pd").checked) command.pd = true;  // absent: the server's mode applies
  const handle = socket.start(command, followRun(run, (_, type) => {
    const isEnd = ["generation.finished", "generation.error", "error"].includes(type);
    if (!isCurrent()) {
      if (isEnd) { renderControls(); renderPipeline(); }
      if (type === "generation.finished") renderStrip();
      return;
    }
    switch (type) {
      case "generation.started":
        state.textLastPiece = run.prompt?.tokens?.at(-1 - base)?.piece ?? null;
        inside.setModel(run.model);
        renderPipeline();
        break;
      case "generation.prefilled":
        renderTokenization();
        renderServing();
        break;
      case "generation.handoff":
        isHandoffUnmarked = true;
        renderServing();
        break;
      case "generation.tokens":
        for (const step of run.steps.slice(numTaken)) {
          // `settings`: what the step was drawn with (its processed column is exact for them);
          // greedy's drawn distribution is all on its token (sampling.js asDrawn).
          state.steps.push({ ...asDrawn(step, settings), index: base + step.index, isAfterHandoff: isHandoffUnmarked,
            settings });
          isHandoffUnmarked = false;
        }
        numTaken = run.steps.length;
        state.selected = state.steps.length - 1;
        renderAll();
        break;
      case "generation.beams":
        renderBeams();
        break;
      case "generation.finished":
        // promptPerplexity stays: every request of the path starts with the same text.
        Object.assign(state, { generationId: run.generation_id, numSent: base });
        renderDistribution();  // now the worker can answer with the exact processed distribution
        renderSpeculation();  // the request's estimated speedup
        if (numBeams > 1) renderBeams();
        renderServing();
        break;
      case "error":
      case "generation.error":
        showError(run.error);
        break;
      default:
        break;
    }
    if (isEnd) { renderControls(); renderPipeline(); }
    if (type === "generation.finished") renderStrip();
  }));
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
  if (step.top_masked?.some((a) => a.token_id === alt.token_id)) {
    showError({ message: interpolate(gettext("The grammar removed “%(piece)s” at this step: the path cannot take it."), { piece: alt.piece }) });
    return;
  }
  const processed = step.top_processed.find((a) => a.token_id === alt.token_id);
  state.steps = state.steps.slice(0, index);
  state.steps.push({
    ...step, token_id: alt.token_id, piece: alt.piece, text_delta: alt.piece, token_bytes: "",
    raw_logprob: alt.logprob, logprob: processed ? processed.logprob : -Infinity,
    rank: step.top_raw.findIndex((a) => a.token_id === alt.token_id) + 1, isBranched: true, isAfterHandoff: false,
    verification: null,  // you chose it: no pass verified it
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
  // the model and its params stay shown (the pipeline) until the next request starts
  Object.assign(state, { steps: [], selected: null, handle: null, run: newRun({ model: state.run.model, params: state.run.params }),
    generationId: null, numSent: 0, promptPerplexity: null });
  inside.setModel(null);  // another model may be chosen: offered again once a request has started
  renderAll();
  renderBeams();
  renderControls();
  renderServing();
}

const isBusy = () => state.handle !== null && !state.handle.isDone;

/** A finished beam search's returned sequences, best first. */
const beamSequences = () => state.run.stats?.sequences ?? [];

// ---------- rendering ----------

function renderAll() {
  renderContinuation();
  renderDistribution();
  updateStepCharts(stepCharts, state.steps);
  renderMoeLive($("#ex-moe-live"), state.run.model, state.steps, state.textLastPiece);
  $("#ex-handoff-legend").hidden = !state.steps.some((s) => s.isAfterHandoff);
  renderTokenization();
  renderPipeline();
  if (state.run.handoff) renderServing();  // the decode segment grows with the tokens
}

/** The phase the strip highlights: a request still waiting for its first token is in prefill. */
function currentPhase() {
  if (isBusy() && !state.run.prefilled) return "prefill";
  return state.selected === null ? null : state.steps[state.selected]?.phase ?? null;
}

function renderPipeline() {
  const model = state.run.model;
  $("#ex-model-label").textContent = model ? model.name ?? model.architecture : gettext("its details come with the first request");
  $("#ex-pipeline").replaceChildren(pipelineStrip({
    model, params: state.run.params, phase: currentPhase(),
    numPromptTokens: state.run.prefilled?.num_prompt_tokens ?? state.run.prompt?.tokens?.length ?? null,
    numPrefilledTokens: state.run.prefilled?.num_prefilled_tokens ?? null,
  }));
}

function renderServing() {
  const p = state.run.prefilled;
  $("#ex-cache-label").textContent = p ? interpolate(gettext("%(prompt)s prompt · %(cached)s cached · %(prefilled)s prefilled · prefill %(time)s"),
    { prompt: p.num_prompt_tokens, cached: p.num_cached_tokens, prefilled: p.num_prefilled_tokens, time: fmtMs(p.prefill_ms) }) : "";
  const views = servingView({ stats: state.run.stats, handoff: state.run.handoff,
    liveDecodeMs: state.run.handoff ? Date.now() - state.run.handoff.receivedAt : 0 });
  const empty = isBusy() ? gettext("Running…") : gettext("After a request: which worker ran it (or the prefill → decode handoff) and its prefix cache.");
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
    class: `step-tok${step.index === state.selected ? " selected" : ""}${step.isBranched ? " branched" : ""}${specClass(step)}`,
    dataset: { step: step.index, tokenId: step.token_id, ...(step.verification ? { pass: step.verification.position } : {}) },
    style: `--p: ${Math.exp(step.raw_logprob).toFixed(3)}`,
    title: interpolate(gettext("step %(step)s · id %(id)s · p %(p)s · rank %(rank)s"),
      { step: step.index, id: step.token_id, p: fmtProb(Math.exp(step.raw_logprob)), rank: step.rank }) + specTitle(step),
    onclick: () => selectStep(step.index),
  }, pieceWithNewlines(step.piece)));
  box.replaceChildren(h("span", { class: "prompt-part" }, $("#ex-text").value), ...tokens);
  $("#ex-count").textContent = interpolate(ngettext("%(n)s token", "%(n)s tokens", state.steps.length), { n: state.steps.length });
  renderStrip();
  renderSpeculation();
}

/** A token's marks from its verification pass: an accepted proposal (green underline), the model's
 * token where it rejected a proposal (red dotted), the first token of a verified pass (a bar before it). */
function specClass(step) {
  const v = step.verification;
  if (!v) return "";
  return (v.position < v.num_accepted ? " spec-accepted" : v.num_accepted < v.proposed.length ? " spec-fixed" : "")
    + (v.position === 0 ? " spec-pass-start" : "");
}

function specTitle(step) {
  const v = step.verification;
  if (!v) return "";
  if (v.position < v.num_accepted) return `\n${gettext("proposed and accepted: verified in one pass with the tokens around it")}`;
  if (v.num_accepted < v.proposed.length) return `\n${gettext("the model's own token where it rejected a proposal")}`;
  return `\n${gettext("the model's own token after the accepted proposals, from the same pass")}`;
}

/** The path's speculation: tokens per forward pass, acceptance, the last request's estimated
 * speedup, the legend and the strip of passes (hidden when no step came out of a verification). */
function renderSpeculation() {
  const box = $("#ex-spec");
  const hasSpec = state.steps.some((s) => s.verification);
  box.hidden = !hasSpec;
  if (!hasSpec) { box.replaceChildren(); return; }
  const summary = speculationSummary(state.steps);
  const stats = state.run.stats;
  const parts = [
    interpolate(gettext("%(tokens)s decode tokens in %(passes)s forward passes: %(per)s tokens per pass"),
      { tokens: summary.numDecodeTokens, passes: summary.numPasses, per: fmtNum(summary.tokensPerPass, 2) }),
    summary.acceptanceRate === null ? null : interpolate(gettext("%(accepted)s of %(proposed)s proposed tokens accepted (%(rate)s)"),
      { accepted: summary.numAccepted, proposed: summary.numProposed, rate: fmtProb(summary.acceptanceRate) }),
    stats?.num_proposed_tokens ? interpolate(gettext("last request: ≈%(x)s× faster than without (estimated from the measured step costs)"),
      { x: fmtNum(stats.speculative_speedup, 2) }) : null,
  ].filter(Boolean);
  box.replaceChildren(
    h("p", { class: "panel-title gap-above-sm" }, gettext("Speculative decoding")),
    h("p", { class: "small", id: "ex-spec-summary", dataset: { tokensPerPass: summary.tokensPerPass ?? "", numAccepted: summary.numAccepted,
      numProposed: summary.numProposed } }, parts.join(" · ")),
    speculationLegend(),
    passStrip(state.steps, { onSelect: (step) => selectStep(step.index), selected: state.selected }));
}

/** A piece's text with a visible ↵ before each line break: a newline token alone would be an
 * empty, unclickable span (the mark is drawn by CSS, so the text stays the model's). */
function pieceWithNewlines(piece) {
  if (!piece.includes("\n")) return piece;
  return piece.split("\n").flatMap((part, i) => (i ? [h("span", { class: "nl-mark", "aria-hidden": "true" }), "\n", part] : [part]))
    .filter((part) => part !== "");
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
  if (ppl?.isLoading) return h("span", { class: "muted" }, gettext("a worker is computing the prompt's perplexity…"));
  if (state.generationId === null || isBusy() || state.run.beamSteps.length) return null;
  return h("button", { class: "btn ghost small prompt-ppl-btn", type: "button",
    title: gettext("a worker scores every token of the prompt (the text) given the ones before it (one forward pass)"),
    onclick: showPromptPerplexity }, gettext("Prompt perplexity"));
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
  const processed = step ? processedFor(step) : Object.assign(new Map(), { isExact: true });
  if (step && !processed.isExact) scheduleExact();
  updateDistributionChart(distChart, step, processed);
  $("#ex-step-label").textContent = step ? interpolate(gettext("step %(step)s · %(phase)s"), { step: step.index, phase: phaseLabel(step.phase) })
    : gettext("no step yet");
  $("#ex-step-info").replaceChildren(...(step ? stepBadges(step) : []));
  $("#ex-mask").replaceChildren(...[step ? maskView(step) : null].filter(Boolean));
  $("#ex-verify").replaceChildren(...[verificationView(step, modelTokenOf(step))].filter(Boolean));
  renderAlternatives(step, processed);
  $("#ex-flat").replaceChildren(...[step ? flatNote(step, processed) : null].filter(Boolean));
}

/**
 * The selected step's processed distribution under the sliders, exact or not at all (a preview
 * renormalized over the listed tokens can be far off: 37% where the truth is 5%): the worker's
 * answer; the step's own when the sliders are what it was drawn with; the browser's when the
 * listed tokens are enough (sampling.js isPreviewExact); else pending until a worker answers.
 */
function processedFor(step) {
  // A grammar's step: the distribution it was drawn from is the only exact one (neither the
  // browser's preview nor a worker's recomputation knows the grammar's mask).
  const exact = step.masked_prob != null ? null : inside.exactFor();
  if (exact) return Object.assign(exact, { isExact: true });
  const settings = samplingParams();
  if (sameSettings(step.settings, settings) || step.masked_prob != null) {
    const drawn = new Map(step.top_processed.map((a) => [a.token_id, a.prob]));
    for (const removed of step.top_masked ?? []) drawn.set(removed.token_id, 0);  // the grammar's: exactly 0
    // Fewer listed than asked for: the filters kept only these; otherwise the rest are below the last.
    const below = step.top_processed.length < step.top_raw.length ? 0 : step.top_processed.at(-1)?.prob ?? 0;
    return Object.assign(drawn, { isExact: true, below });
  }
  const preview = processedProbs(step.top_raw, settings);
  if (preview.isExact) return preview;
  const canAsk = !isBusy() && state.generationId !== null && !state.run.beamSteps.length;
  return Object.assign(new Map(), { isExact: false, isPending: true,
    pendingText: canAsk ? gettext("computing exact…") : isBusy() ? gettext("exact once the request ends") : gettext("not available") });
}

/** The model's own token of the pass `step` came out of (the one after its accepted run). */
function modelTokenOf(step) {
  if (!step?.verification) return null;
  const pass = passesOf(state.steps).find((p) => p.steps.includes(step));
  return pass?.steps[step.verification.num_accepted]?.piece ?? null;
}

let exactTimer = null;
function scheduleExact() {
  clearTimeout(exactTimer);
  exactTimer = setTimeout(() => inside.refreshExact(), 250);
}

function stepBadges(step) {
  const badge = (text, title) => h("span", { class: "badge", title }, text);
  return [
    h("span", { class: "badge" }, gettext("chosen"), " ", h("span", { class: "piece" }, tokenLabel(step.piece, step.token_bytes)), ` id ${step.token_id}`),
    badge(interpolate(gettext("raw p %(p)s · rank %(rank)s"), { p: fmtProb(Math.exp(step.raw_logprob)), rank: step.rank }),
      gettext("probability and rank under the model's own distribution")),
    badge(interpolate(gettext("sampled p %(p)s"), { p: fmtProb(Math.exp(step.logprob)) }), gettext("probability under the distribution it was sampled from")),
    badge(interpolate(gettext("entropy %(nats)s nats"), { nats: fmtNum(step.entropy) })),
    badge(`${fmtMs(step.latency_ms)} ${phaseLabel(step.phase)}`, gettext("time for this step")),
    badge(`KV ${fmtBytes(step.kv_cache_bytes)}`, gettext("KV-cache size after this step")),
    step.isBranched ? badge(gettext("branched here"), gettext("you picked this token")) : null,
  ].filter(Boolean);
}

function renderAlternatives(step, processed) {
  const list = $("#ex-alternatives-list");
  if (!step) { list.replaceChildren(h("p", { class: "empty" }, gettext("Press “Next token” to see the distribution."))); return; }
  const head = h("div", { class: "alt-row alt-head", role: "presentation" },
    h("span", {}, "#"), h("span", {}, gettext("token")), h("span", { class: "num" }, gettext("raw")),
    h("span", { class: "num", id: "ex-processed-head", dataset: { exact: processed.isExact, pending: Boolean(processed.isPending) },
      title: processed.isPending ? gettext("a worker recomputes the distribution under these settings from the step's full scores")
        : gettext("the distribution a token is drawn from under these settings") },
    processed.isPending ? processed.pendingText : gettext("processed")));
  const masked = new Set((step.top_masked ?? []).map((a) => a.token_id));
  const rows = step.top_raw.map((alt, i) => {
    const known = processed.get(alt.token_id);
    const prob = known ?? processed.below ?? 0;
    const isMasked = masked.has(alt.token_id);
    const classes = [alt.token_id === step.token_id ? "chosen" : "", prob === 0 && !processed.isPending ? "filtered" : "",
      isMasked ? "masked" : ""].join(" ");
    return h("button", { type: "button", role: "listitem", class: `alt-row ${classes}`, dataset: { tokenId: alt.token_id, masked: isMasked },
      title: isMasked ? interpolate(gettext("the grammar removed “%(piece)s” (id %(id)s) at this step"), { piece: alt.piece, id: alt.token_id })
        : interpolate(gettext("take “%(piece)s” (id %(id)s) here and continue"), { piece: alt.piece, id: alt.token_id }),
      onclick: () => branch(step.index, alt) },
      h("span", { class: "muted" }, i + 1), h("span", { class: "piece" }, visiblePiece(alt.piece)),
      h("span", { class: "num" }, fmtProb(alt.prob)),
      h("span", { class: "num processed" }, processed.isPending ? "…"
        : known === undefined && prob > 0 ? `< ${fmtProb(prob)}` : fmtProb(prob)));
  });
  list.replaceChildren(head, ...rows);
}

function renderTokenization() {
  const box = $("#ex-tokenization");
  if (!state.run.prompt) { box.replaceChildren(h("p", { class: "empty" }, gettext("Generate a token to see how the model tokenizes the prompt."))); return; }
  box.replaceChildren(promptView(state.run.prompt, state.run.prefilled?.num_cached_tokens ?? 0));
}

function renderBeams() {
  const isBeam = Number($("#ex-beams").value) > 1;
  $("#ex-beam-section").hidden = !isBeam && !state.run.beamSteps.length;
  const best = beamSequences()[0]?.token_ids ?? null;
  $("#ex-beam-label").textContent = state.run.beamSteps.length ? numSteps(state.run.beamSteps.length) : gettext("press Run");
  $("#ex-beam-tree").replaceChildren(state.run.beamSteps.length ? beamTree(state.run.beamSteps, best)
    : h("p", { class: "empty" }, gettext("Press “Run” to search; each column is a step, each box a live beam.")));
  updateBeamCharts(beamCharts, state.run.beamSteps);
  const hasBeams = state.run.beamSteps.length > 0;  // the last request was a beam search
  $("#ex-gen-charts").hidden = hasBeams;
  $("#ex-gen-beam-note").hidden = !hasBeams;
  $("#ex-beam-results").replaceChildren(...beamSequences().map((seq, i) => h("p", { class: "small" },
    h("span", { class: "badge" }, i === 0 ? gettext("best") : `#${i + 1}`), " ", h("span", { class: "mono" }, seq.text),
    h("span", { class: "muted" }, "  ", interpolate(gettext("score %(score)s"), { score: seq.score.toFixed(3) })))));
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

/** Settings from the URL (a link from the lesson page): the controls start from them. */
function applyUrlSettings(settings) {
  const set = (selector, value) => { if (value !== undefined) $(selector).value = String(value); };
  const tick = (selector, value) => { if (value !== undefined) $(selector).checked = value; };
  set("#ex-text", settings.text);
  tick("#ex-chat", settings.chat);
  set("#ex-temperature", settings.temperature);
  set("#ex-top-k", settings.top_k);
  set("#ex-top-p", settings.top_p);
  set("#ex-min-p", settings.min_p);
  set("#ex-seed", settings.seed);
  set("#ex-beams", settings.beams);
  set("#ex-run-length", settings.run);
  tick("#ex-kv-cache", settings.kv_cache);
  tick("#ex-prefix-cache", settings.prefix_cache);
  tick("#ex-pd", settings.pd);
  set("#ex-speculative", settings.speculative);
  showPredictionField();
  if (settings.grammar_kind) grammar.set(settings.grammar_kind, settings.grammar);
  for (const show of sliderOutputs) show();
}

function showPredictionField() {
  $("#ex-prediction-field").hidden = $("#ex-speculative").value !== "prediction";
}

async function init() {
  const urlSettings = readExplorerUrl(location.search);
  applyUrlSettings(urlSettings);
  $("#ex-step").addEventListener("click", () => request(1));
  $("#ex-run").addEventListener("click", () => request(Number(sliders.run_length.value)));
  $("#ex-penalize-prompt").addEventListener("change", () => renderDistribution());
  $("#ex-stop").addEventListener("click", () => state.handle?.stop());
  $("#ex-reset").addEventListener("click", reset);
  $("#ex-text").addEventListener("input", () => { if (state.steps.length || state.run.prompt) reset(); else renderContinuation(); });
  $("#ex-chat").addEventListener("change", reset);
  $("#ex-model").addEventListener("change", reset);
  $("#ex-beams").addEventListener("change", () => { renderControls(); renderBeams(); });
  $("#ex-speculative").addEventListener("change", showPredictionField);
  $("#ex-spec-k").addEventListener("input", (e) => e.target.removeAttribute("aria-invalid"));
  $("#ex-colorize").addEventListener("change", (e) => $("#ex-continuation").classList.toggle("colorize", e.target.checked));
  renderAll();
  renderControls();
  renderServing();
  renderBeams();
  try {
    const models = await getJson("/api/models/");
    const select = $("#ex-model");
    select.replaceChildren(...models.map((m) => h("option", { value: m.id }, m.name)));
    select.value = (models.find((m) => m.id === urlSettings.model) ?? models.find((m) => m.is_default) ?? models[0])?.id ?? "";
    // The Image button only for a model that takes images.
    const showModel = () => attachments.setModel(models.find((m) => String(m.id) === select.value) ?? null);
    select.addEventListener("change", showModel);
    showModel();
    modelStatus.setModels(models);
  } catch (err) {
    showError(err);
  }
}

init();
