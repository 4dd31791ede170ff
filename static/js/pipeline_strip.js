// The explorer's pipeline strip: text → tokenizer → embeddings → layers → logits →
// sampling → append → repeat, filled from `generation.started.model` and the current step,
// with the current phase (prefill or decode) highlighted. Pure DOM builder: the page passes
// everything in; must not know sockets or charts.
import { h } from "./dom.js";
import { fmtBytes, precisionLabel } from "./format.js";

const PHASE_WHY = {
  prefill: "Prefill is compute-bound: the whole prompt goes through every layer in one pass, "
    + "many tokens per weight read, and fills the KV cache.",
  decode: "Decode is memory-bound: each pass makes one token but reads all the weights and the "
    + "whole KV cache, so its speed is set by memory bandwidth, not arithmetic.",
};

function fmtCount(n) {
  if (n == null) return "?";
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)}B`;
  if (n >= 1e6) return `${Math.round(n / 1e6)}M`;
  return n.toLocaleString();
}

/** "temp 0.7 · top-k 40" from the request's sampling params (only what is switched on). */
function samplingSummary(params) {
  if (!params) return "settings";
  if (params.greedy || params.temperature === 0) return "greedy";
  const parts = [`temp ${params.temperature ?? 1}`];
  if (params.top_k) parts.push(`top-k ${params.top_k}`);
  if (params.top_p != null && params.top_p < 1) parts.push(`top-p ${params.top_p}`);
  if (params.min_p) parts.push(`min-p ${params.min_p}`);
  if ((params.num_beams ?? 1) > 1) parts.push(`${params.num_beams} beams`);
  return parts.join(" · ");
}

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
  const numTokensIn = phase === "decode" ? "1 token / pass" : numPass != null ? `${numPass} token${numPass === 1 ? "" : "s"} / pass` : "N tokens";
  const stages = [
    stage("text", "prompt", { id: "text" }),
    stage("tokenizer", numPromptTokens != null ? `${numPromptTokens} tokens` : "N tokens", { id: "tokenizer" }),
    stage("embeddings", m.hidden_size ? `${m.hidden_size}-d` : "hidden size", { id: "embeddings",
      title: "each token id becomes a vector of this size" }),
    stage(`${m.num_layers ?? "L"} transformer layers`, numTokensIn, { id: "layers", isActive: phase !== null,
      title: "attention (reads and extends the KV cache) and an MLP, repeated per layer" }),
    stage("logits", m.vocab_size ? `${m.vocab_size.toLocaleString()} vocab` : "vocab", { id: "logits",
      title: "one score per vocabulary entry, for the last position only" }),
    stage("sampling", samplingSummary(params), { id: "sampling", title: "processors, then a draw (or argmax)" }),
    stage("append", "token → sequence", { id: "append" }),
  ];
  const flow = h("div", { class: "pipe-flow" }, stages.flatMap((s, i) => (i ? [arrow(), s] : [s])),
    h("span", { class: "pipe-repeat", title: "decode: repeat with the new token until EOS or the limit" }, "↻ repeat"));
  const phases = h("div", { class: "pipe-phases" },
    ["prefill", "decode"].map((name) => h("span", { class: `pipe-phase pipe-phase-${name}${phase === name ? " active" : ""}`,
      title: PHASE_WHY[name] }, name)),
    h("span", { class: "pipe-why muted" }, phase ? PHASE_WHY[phase] : "Press “Next token” or “Run” to see the current phase."));
  const meta = model ? h("div", { class: "pipe-meta muted small" }, [
    m.architecture, m.num_params != null ? `${fmtCount(m.num_params)} params` : null, precisionLabel(m), m.device,
    m.runner ? `runner ${m.runner}${m.kernels ? ` on ${m.kernels}` : ""}` : null, m.kv_bytes_per_token ? `${fmtBytes(m.kv_bytes_per_token)} KV / token` : null,
    m.max_context ? `${m.max_context.toLocaleString()} ctx` : null,
  ].filter(Boolean).join(" · ")) : null;
  return h("div", { class: "pipeline-strip" }, flow, phases, meta);
}
