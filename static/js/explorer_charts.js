// The explorer's Chart.js charts. Owns: chart set-up and turning steps into chart data.
// Chart.js is loaded as a classic script (static/vendor/chart.js, global `Chart`).
import { fmtBytes, fmtMs, fmtProb, fmtSi, phaseLabel, visiblePiece } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

const Chart = window.Chart;
export const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

const MAX_DIST_BARS = 20;

export function baseOptions(extra = {}) {
  return {
    animation: false,
    responsive: true,
    maintainAspectRatio: false,
    interaction: { mode: "index", intersect: false },
    plugins: { legend: { display: false } },
    ...extra,
  };
}

export function applyTheme() {
  Chart.defaults.font.family = css("--font");
  Chart.defaults.font.size = 11;
  Chart.defaults.color = css("--muted");
  Chart.defaults.borderColor = css("--border");
}

/** Horizontal bars: raw vs processed probability of the top tokens for one step. */
export function createDistributionChart(canvas, onPick) {
  applyTheme();
  return new Chart(canvas, {
    type: "bar",
    data: { labels: [], datasets: [
      { label: gettext("raw (model)"), data: [], backgroundColor: css("--border-strong"), borderRadius: 3, barPercentage: 0.9, categoryPercentage: 0.8 },
      { label: gettext("processed (sliders)"), data: [], backgroundColor: css("--accent"), borderRadius: 3, barPercentage: 0.9, categoryPercentage: 0.8 },
    ] },
    options: baseOptions({
      indexAxis: "y",
      interaction: { mode: "index", intersect: false, axis: "y" },
      plugins: {
        legend: { display: true, position: "top", align: "end", labels: { boxWidth: 10, boxHeight: 10 } },
        tooltip: { callbacks: { label: (ctx) => `${ctx.dataset.label}: ${fmtProb(ctx.parsed.x)}` } },
      },
      scales: {
        x: { min: 0, max: 1, ticks: { callback: (v) => `${Math.round(v * 100)}%` } },
        y: { ticks: { font: { family: css("--mono") }, autoSkip: false } },
      },
      onClick: (_event, elements, chart) => {
        if (elements.length) onPick(chart.$alternatives[elements[0].index]);
      },
      onHover: (event, elements) => { event.native.target.style.cursor = elements.length ? "pointer" : "default"; },
    }),
  });
}

/** Show `step`'s alternatives; `processed` maps token_id -> probability under the sliders. */
export function updateDistributionChart(chart, step, processed) {
  const alternatives = step ? step.top_raw.slice(0, MAX_DIST_BARS) : [];
  chart.$alternatives = alternatives;
  chart.data.labels = alternatives.map((a) => visiblePiece(a.piece));
  const chosenColour = css("--prefill");
  chart.data.datasets[0].data = alternatives.map((a) => a.prob);
  chart.data.datasets[0].backgroundColor = alternatives.map((a) => (a.token_id === step.token_id ? chosenColour : css("--border-strong")));
  // Nothing rather than a wrong number while the exact distribution is being computed.
  chart.data.datasets[1].data = alternatives.map((a) => (processed.isPending ? null : processed.get(a.token_id) ?? 0));
  chart.update();
}

/** The four per-step charts under the text: probability, entropy, latency, KV cache. */
export function createStepCharts(canvases, onSelect) {
  applyTheme();
  const onClick = (_event, elements) => elements.length && onSelect(elements[0].index);
  const line = (canvas, datasets, yOptions, tooltipLabel) => new Chart(canvas, {
    type: "line",
    data: { labels: [], datasets: datasets.map((d) => ({ pointRadius: 2.5, borderWidth: 2, tension: 0.25, data: [], ...d })) },
    options: baseOptions({
      onClick,
      scales: { x: { ticks: { maxRotation: 0, autoSkipPadding: 8 } }, y: yOptions },
      plugins: { legend: { display: datasets.length > 1, position: "top", align: "end", labels: { boxWidth: 10, boxHeight: 10 } },
        tooltip: { callbacks: { label: tooltipLabel } } },
    }),
  });
  return {
    prob: line(canvases.prob, [
      { label: gettext("raw"), borderColor: css("--muted"), backgroundColor: css("--muted") },
      { label: gettext("sampled"), borderColor: css("--accent"), backgroundColor: css("--accent") },
    ], { min: 0, max: 1, ticks: { callback: (v) => `${Math.round(v * 100)}%` } },
    (ctx) => `${ctx.dataset.label}: ${fmtProb(ctx.parsed.y)}`),
    entropy: line(canvases.entropy, [{ label: gettext("entropy"), borderColor: css("--role"), backgroundColor: css("--role") }],
      { min: 0, title: { display: true, text: "nats" } }, (ctx) => `${ctx.parsed.y.toFixed(2)} nats`),
    latency: new Chart(canvases.latency, {
      type: "bar",
      data: { labels: [], datasets: [{ label: gettext("latency"), data: [], backgroundColor: [], borderRadius: 3 }] },
      options: baseOptions({
        onClick,
        scales: { x: { ticks: { maxRotation: 0, autoSkipPadding: 8 } }, y: { min: 0, title: { display: true, text: "ms" } } },
        plugins: { legend: { display: false }, tooltip: { callbacks: { label: (ctx) => `${fmtMs(ctx.parsed.y)} (${ctx.chart.$phases[ctx.dataIndex]})` } } },
      }),
    }),
    kv: line(canvases.kv, [{ label: "KV cache", borderColor: css("--cached"), backgroundColor: css("--cached"), fill: false }],
      // With no bytes yet (no step, or the KV cache off) Chart.js would span 0..1 and label
      // fractions of a byte: whole bytes only, and at least 1 KiB of axis.
      { min: 0, suggestedMax: 1024, ticks: { precision: 0, callback: (v) => fmtBytes(v) } }, (ctx) => fmtBytes(ctx.parsed.y)),
  };
}

function latencyColour(step) {
  if (step.isAfterHandoff) return "--handoff";
  return step.phase === "prefill" ? "--prefill" : "--decode";
}

export function updateStepCharts(charts, steps) {
  const labels = steps.map((s) => `${s.index}`);
  for (const chart of Object.values(charts)) chart.data.labels = labels;
  charts.prob.data.datasets[0].data = steps.map((s) => Math.exp(s.raw_logprob));
  charts.prob.data.datasets[1].data = steps.map((s) => Math.exp(s.logprob));
  charts.entropy.data.datasets[0].data = steps.map((s) => s.entropy);
  charts.latency.$phases = steps.map((s) => (s.isAfterHandoff
    ? interpolate(gettext("%(phase)s, first after the PD handoff"), { phase: phaseLabel(s.phase) }) : phaseLabel(s.phase)));
  charts.latency.data.datasets[0].data = steps.map((s) => s.latency_ms);
  charts.latency.data.datasets[0].backgroundColor = steps.map((s) => css(latencyColour(s)));
  charts.kv.data.datasets[0].data = steps.map((s) => s.kv_cache_bytes);
  for (const chart of Object.values(charts)) chart.update();
}

const isPowerOfTen = (v) => Math.abs(Math.log10(v) - Math.round(Math.log10(v))) < 1e-9;

/**
 * The roofline, log-log: the roof min(peak, intensity x bandwidth) bending at the ridge, and
 * where prefill and decode ran (their intensity, the FLOP/s they achieved). `r` is the
 * inspection's roofline view (docs/inside.md).
 */
export function createRooflineChart(canvas, { device, prefill, decode }) {
  applyTheme();
  const phases = [prefill, decode].filter(Boolean);
  const roofAt = (x) => Math.min(device.matmul_flops_per_s, x * device.memory_bytes_per_s);
  const xs = [device.ridge, ...phases.map((p) => p.intensity)];
  const [xMin, xMax] = [Math.min(...xs) / 4, Math.max(...xs) * 4];
  const ys = [roofAt(xMin), ...phases.map((p) => p.achieved_flops_per_s).filter((y) => y > 0)];
  const [yMin, yMax] = [Math.min(...ys) / 2, device.matmul_flops_per_s * 2];
  const point = (phase, label, colour) => ({ label, data: phase ? [{ x: phase.intensity, y: phase.achieved_flops_per_s }] : [],
    backgroundColor: css(colour), borderColor: css(colour), pointRadius: 7, pointHoverRadius: 9 });
  const line = (label, data, colour, extra = {}) => ({ label, data, showLine: true, pointRadius: 0, borderWidth: 2,
    borderColor: css(colour), backgroundColor: css(colour), ...extra });
  return new Chart(canvas, {
    type: "scatter",
    data: { datasets: [
      line(gettext("roof"), [xMin, device.ridge, xMax].map((x) => ({ x, y: roofAt(x) })), "--text-2"),
      line(gettext("ridge"), [{ x: device.ridge, y: yMin }, { x: device.ridge, y: device.matmul_flops_per_s }], "--muted", { borderDash: [4, 4], borderWidth: 1 }),
      point(prefill, phaseLabel("prefill"), "--prefill"),
      point(decode, phaseLabel("decode"), "--decode"),
    ] },
    options: baseOptions({
      interaction: { mode: "nearest", intersect: true },
      plugins: {
        legend: { display: true, position: "top", align: "end", labels: { boxWidth: 10, boxHeight: 10 } },
        tooltip: { callbacks: { label: (ctx) => `${ctx.dataset.label}: ${fmtSi(ctx.parsed.x, "FLOP/B")}, ${fmtSi(ctx.parsed.y, "FLOP/s")}` } },
      },
      scales: {
        x: { type: "logarithmic", min: xMin, max: xMax, title: { display: true, text: gettext("arithmetic intensity (FLOP per byte moved)") },
          ticks: { callback: (v) => (isPowerOfTen(v) ? fmtSi(v) : "") } },
        y: { type: "logarithmic", min: yMin, max: yMax, title: { display: true, text: "FLOP/s" },
          ticks: { callback: (v) => (isPowerOfTen(v) ? fmtSi(v, "FLOP/s") : "") } },
      },
    }),
  });
}
