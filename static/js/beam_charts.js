// The explorer's per-step charts of a beam search, which has no single chosen token per step:
// the best live beam's score, how many beams were live and how many hypotheses finished at each
// step, and the step's latency. Owns: turning `beam_step` records (docs/protocol.md) into
// chart data. Chart.js is the global `Chart` (see explorer_charts.js).
import { applyTheme, baseOptions, css } from "./explorer_charts.js";
import { fmtMs } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

const Chart = window.Chart;

/** What the charts plot for one beam step. */
export function beamStepSummary(step) {
  const live = step.beams.filter((b) => !b.is_finished);
  const best = live[0] ?? step.beams[0];  // live beams come best first; all finished: the best of those
  return { bestScore: best?.score ?? null, numLive: live.length, numFinished: step.beams.length - live.length };
}

export function createBeamCharts(canvases) {
  applyTheme();
  const xScale = { ticks: { maxRotation: 0, autoSkipPadding: 8 } };
  return {
    score: new Chart(canvases.score, {
      type: "line",
      data: { labels: [], datasets: [{ label: gettext("best live beam's score"), data: [], pointRadius: 2.5, borderWidth: 2,
        tension: 0.25, borderColor: css("--accent"), backgroundColor: css("--accent") }] },
      options: baseOptions({ scales: { x: xScale, y: { title: { display: true, text: "score" } } },
        plugins: { legend: { display: false }, tooltip: { callbacks: { label: (ctx) => interpolate(gettext("score %(score)s"), { score: ctx.parsed.y.toFixed(3) }) } } } }),
    }),
    beams: new Chart(canvases.beams, {
      type: "bar",
      data: { labels: [], datasets: [
        { label: gettext("live beams"), data: [], backgroundColor: css("--accent"), borderRadius: 3, stack: "beams" },
        { label: gettext("finished here"), data: [], backgroundColor: css("--border-strong"), borderRadius: 3, stack: "beams" },
      ] },
      options: baseOptions({ scales: { x: { ...xScale, stacked: true }, y: { min: 0, stacked: true, ticks: { precision: 0 } } },
        plugins: { legend: { display: true, position: "top", align: "end", labels: { boxWidth: 10, boxHeight: 10 } } } }),
    }),
    latency: new Chart(canvases.latency, {
      type: "bar",
      data: { labels: [], datasets: [{ label: gettext("latency"), data: [], backgroundColor: [], borderRadius: 3 }] },
      options: baseOptions({ scales: { x: xScale, y: { min: 0, title: { display: true, text: "ms" } } },
        plugins: { legend: { display: false }, tooltip: { callbacks: { label: (ctx) => fmtMs(ctx.parsed.y) } } } }),
    }),
  };
}

export function updateBeamCharts(charts, beamSteps) {
  const summaries = beamSteps.map(beamStepSummary);
  const labels = beamSteps.map((s) => `${s.index}`);
  for (const chart of Object.values(charts)) chart.data.labels = labels;
  charts.score.data.datasets[0].data = summaries.map((s) => s.bestScore);
  charts.beams.data.datasets[0].data = summaries.map((s) => s.numLive);
  charts.beams.data.datasets[1].data = summaries.map((s) => s.numFinished);
  charts.latency.data.datasets[0].data = beamSteps.map((s) => s.latency_ms);
  charts.latency.data.datasets[0].backgroundColor = beamSteps.map((s) => css(s.phase === "prefill" ? "--prefill" : "--decode"));
  for (const chart of Object.values(charts)) chart.update();
}
