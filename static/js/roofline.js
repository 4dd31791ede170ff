// The "Roofline" view of "Inside this step": the last finished request's timeline (queue,
// prefill, PD hand-over, each decode step) and its prefill and decode on a roofline built from
// the device limits the worker measured (view "roofline" of POST /api/generations/<id>/inspect/,
// docs/inside.md). Owns: drawing the answer (timeline bar, table, chart, the sentence that
// says which roof limits each phase). Must not know: requests, the explorer's state.
import { createRooflineChart } from "./explorer_charts.js";
import { h } from "./dom.js";
import { fmtBytes, fmtMs, fmtSi, phaseLabel } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

export const EXPLAIN = gettext("A step waits either for arithmetic (FLOP/s) or for memory to deliver the weights and the KV "
  + "cache (bytes/s). Which one depends on its arithmetic intensity, the FLOPs done per byte moved: the roof is the "
  + "fastest this worker's device can go at each intensity, rising with memory bandwidth up to the ridge, flat at the "
  + "matmul peak beyond it. Prefill multiplies every weight it reads by all the prompt's tokens at once, so it lands "
  + "right of the ridge (compute-bound); decode reads every weight again for a single token, so it lands left of it "
  + "(memory-bound).");

const PHASE_NAME = { queue: gettext("queue"), prefill: phaseLabel("prefill"), handoff: gettext("PD hand-over"), decode: phaseLabel("decode") };

let chart = null;  // one roofline chart at a time: the previous one is destroyed with its canvas

export function renderRoofline(r) {
  const canvas = h("canvas", { id: "roofline-chart" });
  chart?.destroy();
  // Chart.js sizes a canvas from its box: draw once `show` has put the view in the page.
  queueMicrotask(() => { chart = createRooflineChart(canvas, r); });
  return h("div", { class: "inside-view small", id: "inside-roofline" },
    timelineBar(r.timeline), deviceLine(r.device), verdict(r), phaseTable(r),
    h("div", { class: "chart-box roofline-box" }, canvas));
}

function timelineBar(segments) {
  const totalMs = segments.reduce((sum, s) => sum + s.ms, 0) || 1;
  const label = (s) => (s.phase === "decode" ? interpolate(gettext("decode step %(step)s"), { step: s.step }) : PHASE_NAME[s.phase]);
  const bar = h("div", { class: "pd-bar", id: "rl-timeline", role: "img",
    "aria-label": segments.map((s) => `${label(s)} ${fmtMs(s.ms)}`).join(", ") },
  segments.map((s) => h("span", { class: `rl-seg rl-${s.phase}`, title: `${label(s)}: ${fmtMs(s.ms)}`,
    dataset: { phase: s.phase, ms: s.ms, step: s.step ?? "" }, style: `flex-grow: ${s.ms / totalMs}` })));
  const decode = segments.filter((s) => s.phase === "decode");
  const legend = ["queue", "prefill", "handoff"].filter((phase) => segments.some((s) => s.phase === phase))
    .map((phase) => [PHASE_NAME[phase], segments.find((s) => s.phase === phase).ms, phase]);
  if (decode.length) legend.push([interpolate(ngettext("decode (%(n)s step)", "decode (%(n)s steps)", decode.length), { n: decode.length }), decode.reduce((sum, s) => sum + s.ms, 0), "decode"]);
  return h("div", { class: "rl-timeline" }, h("p", { class: "chart-title" }, gettext("Timeline of the request")), bar,
    h("div", { class: "pd-legend" }, legend.map(([name, ms, phase]) => h("span", { class: "pd-item", dataset: { legend: phase } },
      h("span", { class: `swatch rl-${phase}` }), h("b", {}, name), ` ${fmtMs(ms)}`))));
}

export function deviceLine(d) {
  // A roof this request's own prefill or decode beat is raised to what it reached (`raised_by`): no point above 100%.
  const raised = d.raised_by ?? {};
  const peakFrom = raised.matmul_flops_per_s
    ? interpolate(gettext("(reached by this request's %(phase)s; the %(n)s×%(n)s product timed %(measured)s), memory"),
      { phase: phaseLabel(raised.matmul_flops_per_s), n: d.matmul_size, measured: fmtSi(d.measured_matmul_flops_per_s, "FLOP/s") })
    : interpolate(gettext("(a %(n)s×%(n)s product), memory"), { n: d.matmul_size });
  const bandwidthFrom = raised.memory_bytes_per_s
    ? interpolate(gettext("(reached by this request's %(phase)s; a sum over %(bytes)s measured %(measured)s): ridge at"),
      { phase: phaseLabel(raised.memory_bytes_per_s), bytes: fmtBytes(d.copy_bytes), measured: fmtSi(d.measured_memory_bytes_per_s, "B/s") })
    : interpolate(gettext("(a sum over %(bytes)s): ridge at"), { bytes: fmtBytes(d.copy_bytes) });
  return h("p", { id: "rl-device" },
    interpolate(gettext("Measured by the worker on its %(device)s (%(dtype)s): matmul peak"), { device: d.device, dtype: d.dtype }), " ",
    h("b", { id: "rl-peak" }, fmtSi(d.matmul_flops_per_s, "FLOP/s")), " ", peakFrom, " ",
    h("b", { id: "rl-bandwidth" }, fmtSi(d.memory_bytes_per_s, "B/s")), " ", bandwidthFrom, " ",
    h("b", { id: "rl-ridge" }, fmtSi(d.ridge, "FLOP/byte")), ".");
}

/** One sentence per phase, from the numbers measured: which side of the ridge, and so which roof. */
function verdict(r) {
  const ridge = fmtSi(r.device.ridge, "FLOP/byte");
  const side = (p) => (p.bound === "compute" ? gettext("right of the ridge") : gettext("left of the ridge"));
  const limit = (p) => (p.bound === "compute" ? gettext("compute-bound: the arithmetic units limit it") : gettext("memory-bound: memory bandwidth limits it"));
  const p = r.prefill;
  const lines = [h("p", { dataset: { phase: "prefill", bound: p.bound } },
    interpolate(ngettext("Prefill ran %(n)s token through the model in one pass, so each weight read served %(n)s: %(intensity)s, %(side)s (%(ridge)s), %(limit)s.",
      "Prefill ran %(n)s tokens through the model in one pass, so each weight read served %(n)s: %(intensity)s, %(side)s (%(ridge)s), %(limit)s.", p.num_tokens),
    { n: p.num_tokens, intensity: fmtSi(p.intensity, "FLOP/byte"), side: side(p), ridge, limit: limit(p) }))];
  const d = r.decode;
  lines.push(d ? h("p", { dataset: { phase: "decode", bound: d.bound } },
    interpolate(ngettext("The decode step read every weight again for one token: %(intensity)s, %(side)s, %(limit)s.",
      "Each of the %(n)s decode steps read every weight again for one token: %(intensity)s, %(side)s, %(limit)s.", d.num_passes),
    { n: d.num_passes, intensity: fmtSi(d.intensity, "FLOP/byte"), side: side(d), limit: limit(d) }))
    : h("p", { class: "muted" }, gettext("This request generated one token, from the prefill: no decode step to place (Run a few tokens).")));
  return h("div", { id: "rl-verdict" }, lines);
}

const ROWS = [
  ["tokens", gettext("tokens computed (forward passes)"), (p) => `${p.num_tokens} (${p.num_passes})`],
  ["flops", gettext("FLOPs (model shapes × tokens, attention × context)"), (p) => fmtSi(p.flops, "FLOP")],
  ["bytes", gettext("bytes moved (weights once per pass + KV cache)"), (p) => `${fmtBytes(p.bytes.total)} (${fmtBytes(p.bytes.weights)} + ${fmtBytes(p.bytes.kv_cache)})`],
  ["intensity", gettext("arithmetic intensity"), (p) => fmtSi(p.intensity, "FLOP/byte")],
  ["ms", gettext("time (recorded)"), (p) => fmtMs(p.ms)],
  ["achieved", gettext("achieved"), (p) => `${fmtSi(p.achieved_flops_per_s, "FLOP/s")} · ${fmtSi(p.achieved_bytes_per_s, "B/s")}`],
  ["roof", gettext("roof at this intensity"), (p) => fmtSi(p.roof_flops_per_s, "FLOP/s")],
  ["fraction", gettext("of the roof"), (p) => (p.fraction_of_roof === null ? "–" : `${Math.round(p.fraction_of_roof * 100)}%`)],
];

function phaseTable(r) {
  const phases = [["prefill", r.prefill], ["decode", r.decode]].filter(([, p]) => p);
  return h("table", { class: "inside-table", id: "rl-table" },
    h("thead", {}, h("tr", {}, h("th", {}, ""), phases.map(([name]) => h("th", { class: "num" }, phaseLabel(name))))),
    h("tbody", {}, ROWS.map(([key, name, show]) => h("tr", { dataset: { row: key } }, h("td", {}, name),
      phases.map(([phase, p]) => h("td", { class: "num", dataset: { phase } }, show(p)))))));
}
