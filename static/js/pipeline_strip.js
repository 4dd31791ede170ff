// The explorer's pipeline strip: text → tokenizer → embeddings → layers → logits →
// sampling → append → repeat, filled from `generation.started.model` and the current step,
// with the current phase (prefill or decode) highlighted. Pure DOM builder: the page passes
// everything in; must not know sockets or charts.
import { h } from "./dom.js";
import { fmtBytes, fmtCount, phaseLabel, precisionLabel } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

const PHASE_WHY = {
  prefill: gettext("Prefill is compute-bound: the whole prompt goes through every layer in one pass, "
    + "many tokens per weight read, and fills the KV cache."),
  decode: gettext("Decode is memory-bound: each pass makes one token but reads all the weights and the "
    + "whole KV cache, so its speed is set by memory bandwidth, not arithmetic."),
};

/** "temp 0.7 · top-k 40" from the request's sampling params (only what is switched on). */
function samplingSummary(params) {
  if (!params) return gettext("settings");
  if (params.greedy || params.temperature === 0) return gettext("greedy");
  const parts = [interpolate(gettext("temp %(t)s"), { t: params.temperature ?? 1 })];
  if (params.top_k) parts.push(`top-k ${params.top_k}`);
  if (params.top_p != null && params.top_p < 1) parts.push(`top-p ${params.top_p}`);
  if (params.min_p) parts.push(`min-p ${params.min_p}`);
  if ((params.num_beams ?? 1) > 1) parts.push(interpolate(gettext("%(n)s beams"), { n: params.num_beams }));
  return parts.join(" · ");
}

// What runs between the matmuls, as the engine's model info names it.
const KERNELS = { "fused CPU kernels": gettext("fused CPU kernels"), "torch ops": gettext("torch ops") };

function stage(name, detail, { id, title, isActive = false } = {}) {
  return h("div", { class: `pipe-stage${isActive ? " active" : ""}`, dataset: id ? { stage: id } : undefined, title },
    h("span", { class: "pipe-name" }, name), h("span", { class: "pipe-detail" }, detail));
}

const arrow = () => h("span", { class: "pipe-arrow", "aria-hidden": "true" }, "→");

/**
 * `model`: generation.started.model (null before the first request); `numPromptTokens`;
 * `numPrefilledTokens`: those the prefill computed (the rest came from the prefix cache);
 * `params`: the request's sampling params; `phase`: "prefill", "decode" or null (idle).
 */
export function pipelineStrip({ model = null, numPromptTokens = null, numPrefilledTokens = null, params = null, phase = null }) {
  const m = model ?? {};
  const numPass = numPrefilledTokens ?? numPromptTokens;
  const numTokensIn = phase === "decode" ? gettext("1 token / pass")
    : numPass != null ? interpolate(ngettext("%(n)s token / pass", "%(n)s tokens / pass", numPass), { n: numPass }) : gettext("N tokens");
  const stages = [
    stage(gettext("text"), gettext("prompt"), { id: "text" }),
    stage(gettext("tokenizer"), numPromptTokens != null ? interpolate(gettext("%(n)s tokens"), { n: numPromptTokens }) : gettext("N tokens"), { id: "tokenizer" }),
    stage(gettext("embeddings"), m.hidden_size ? `${m.hidden_size}-d` : gettext("hidden size"), { id: "embeddings",
      title: gettext("each token id becomes a vector of this size") }),
    stage(interpolate(gettext("%(n)s transformer layers"), { n: m.num_layers ?? "L" }), numTokensIn, { id: "layers", isActive: phase !== null,
      title: gettext("attention (reads and extends the KV cache) and an MLP, repeated per layer") }),
    stage(gettext("logits"), m.vocab_size ? interpolate(gettext("%(n)s vocab"), { n: m.vocab_size.toLocaleString() }) : gettext("vocab"), { id: "logits",
      title: gettext("one score per vocabulary entry, for the last position only") }),
    stage(gettext("sampling"), samplingSummary(params), { id: "sampling", title: gettext("processors, then a draw (or argmax)") }),
    stage(gettext("append"), gettext("token → sequence"), { id: "append" }),
  ];
  const flow = h("div", { class: "pipe-flow" }, stages.flatMap((s, i) => (i ? [arrow(), s] : [s])),
    h("span", { class: "pipe-repeat", title: gettext("decode: repeat with the new token until EOS or the limit") }, gettext("↻ repeat")));
  const phases = h("div", { class: "pipe-phases" },
    ["prefill", "decode"].map((name) => h("span", { class: `pipe-phase pipe-phase-${name}${phase === name ? " active" : ""}`,
      title: PHASE_WHY[name] }, phaseLabel(name))),
    h("span", { class: "pipe-why muted" }, phase ? PHASE_WHY[phase] : gettext("Press “Next token” or “Run” to see the current phase.")));
  const meta = model ? h("div", { class: "pipe-meta muted small" }, [
    m.architecture, m.num_params != null ? interpolate(gettext("%(n)s params"), { n: fmtCount(m.num_params) }) : null, precisionLabel(m), m.device,
    m.runner ? (m.kernels ? interpolate(gettext("runner %(runner)s on %(kernels)s"), { runner: m.runner, kernels: KERNELS[m.kernels] ?? m.kernels })
      : interpolate(gettext("runner %(runner)s"), { runner: m.runner })) : null,
    m.kv_bytes_per_token ? interpolate(gettext("%(bytes)s KV / token"), { bytes: fmtBytes(m.kv_bytes_per_token) }) : null,
    m.max_context ? interpolate(gettext("%(n)s ctx"), { n: m.max_context.toLocaleString() }) : null,
  ].filter(Boolean).join(" · ")) : null;
  // Whether this run's numbers are reproducible: what a class comparing answers needs (docs/inside.md).
  const determinism = model && m.batch_invariant != null ? h("div", {
    class: `pipe-determinism small ${m.batch_invariant ? "is-deterministic" : "muted"}`,
    title: gettext("Batch invariance: each token is computed in one fixed order, whatever else shares its step and however its prefix was computed, so asking again (or replaying a seed) gives the same tokens and probabilities."),
  }, m.batch_invariant
    ? gettext("Deterministic: the same request gives the same tokens and probabilities, alone or batched, cold or from the prefix cache.")
    : gettext("Not batch-invariant: the last digits of a probability may change with what shares the step.")) : null;
  return h("div", { class: "pipeline-strip" }, flow, phases, meta, determinism);
}
