// The A/B alignment (inspection view "ab", docs/inside.md): per step both chosen tokens, the
// flips and KL(A‖B), as a chart and a table. Owns: drawing one answer of the worker.
// Must not know: the socket, the requests, the run columns.
import { h } from "./dom.js";
import { applyTheme, baseOptions, css } from "./explorer_charts.js";
import { fmtKl, visiblePiece } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

const Chart = window.Chart;
const piece = (p) => h("span", { class: "piece" }, visiblePiece(p ?? ""));

export function createAlignment(root) {
  const summary = h("p", { id: "ab-summary", class: "small" });
  const table = h("div", { id: "ab-table", class: "inside-view" });
  const canvas = h("canvas", { id: "ab-kl-chart", "aria-label": gettext("KL divergence per step") });
  root.replaceChildren(summary,
    h("p", { class: "chart-title" }, gettext("KL(A‖B) per step (nats)"),
      h("span", { class: "muted" }, h("span", { class: "swatch ab-swatch-same" }), gettext("same context"), " ",
        h("span", { class: "swatch ab-swatch-flip" }), gettext("flip"), " ", h("span", { class: "swatch ab-swatch-own" }),
        gettext("after the first flip (contexts differ)"), " ", h("span", { class: "swatch ab-swatch-infinite" }), "∞")),
    h("div", { class: "chart-box small" }, canvas), table);
  const chart = klChart(canvas);

  function clear(text, isError = false) {
    summary.replaceChildren(h("span", { class: isError ? "alert" : "muted" }, text));
    table.replaceChildren();
    update(chart, []);
  }

  function show(result) {
    summary.replaceChildren(summaryText(result));
    table.replaceChildren(alignedTable(result));
    update(chart, result.steps);
  }

  clear(gettext("Press “Run A and B”: once both runs end, a worker recomputes every step of both and aligns them."));
  return { clear, show };
}

function summaryText(r) {
  const flips = r.steps.filter((s) => s.flipped).length;
  const lengths = r.num_steps_a === r.num_steps_b ? ""
    : ` ${interpolate(gettext("A wrote %(a)s tokens and B %(b)s: the alignment stops at the shorter."), { a: r.num_steps_a, b: r.num_steps_b })}`;
  if (r.first_flip === null) {
    return interpolate(gettext("No flip: A and B chose the same %(n)s tokens, reading the same text at every step."), { n: r.num_steps }) + lengths;
  }
  const first = r.steps[r.first_flip];
  return interpolate(gettext("%(flips)s of %(n)s steps flip. The first is step %(first)s: A chose “%(a)s”, B “%(b)s”. After it the contexts differ: each side's distribution is recomputed on its own text, so the KL there compares two texts as well as two settings."),
    { flips, n: r.num_steps, first: r.first_flip, a: visiblePiece(first.a_piece), b: visiblePiece(first.b_piece) }) + lengths;
}

function alignedTable(r) {
  const head = h("tr", {}, ...[gettext("step"), "A", "B", gettext("flip"), "KL(A‖B) nats"].map((t) => h("th", { class: t.startsWith("KL") ? "num" : "" }, t)));
  const rows = r.steps.flatMap((s) => {
    const row = h("tr", { class: `${s.flipped ? "flip" : ""}${s.same_context ? "" : " own-context"}`,
      dataset: { step: s.index, flipped: s.flipped, kl: s.kl ?? "inf" } },
    h("td", { class: "num" }, s.index), h("td", {}, piece(s.a_piece)), h("td", {}, piece(s.b_piece)),
    h("td", { class: "flip-mark" }, s.flipped ? "≠" : ""),
    h("td", { class: "num kl", title: s.kl === null ? gettext("A could pick a token B's settings remove") : "" }, fmtKl(s.kl)));
    if (s.index !== r.first_flip || s.index === r.num_steps - 1) return [row];
    return [row, h("tr", { class: "ab-divider" }, h("td", { colspan: 5 }, gettext("From here on the contexts differ: each side reads its own text.")))];
  });
  return h("table", { class: "inside-table ab-table" }, h("thead", {}, head), h("tbody", {}, ...rows));
}

function klChart(canvas) {
  applyTheme();
  return new Chart(canvas, {
    type: "bar",
    // The second dataset marks infinite steps with a bar to the top of the axis, on the same
    // spot (not grouped): the first holds the numbers, null where infinite.
    data: { labels: [], datasets: [
      { label: "KL(A‖B)", data: [], backgroundColor: [], borderRadius: 3, grouped: false },
      { label: "∞", data: [], backgroundColor: css("--danger"), borderRadius: 3, grouped: false },
    ] },
    options: baseOptions({
      scales: { x: { ticks: { maxRotation: 0, autoSkipPadding: 8 } }, y: { min: 0, title: { display: true, text: "nats" } } },
      plugins: { legend: { display: false }, tooltip: { filter: (item) => item.raw !== null, callbacks: {
        label: (ctx) => `KL ${fmtKl(ctx.chart.$steps[ctx.dataIndex].kl)} nats${ctx.chart.$steps[ctx.dataIndex].flipped ? ` · ${gettext("flip")}` : ""}`,
      } } },
    }),
  });
}

function update(chart, steps) {
  chart.$steps = steps;
  chart.data.labels = steps.map((s) => `${s.index}`);
  chart.data.datasets[0].data = steps.map((s) => s.kl);  // null (∞) draws no bar here
  const top = Math.max(1, ...steps.map((s) => s.kl ?? 0)) * 1.1;
  chart.data.datasets[1].data = steps.map((s) => (s.kl === null ? top : null));
  chart.data.datasets[0].backgroundColor = steps.map((s) => css(s.flipped ? "--prefill" : s.same_context ? "--accent" : "--border-strong"));
  chart.update();
}
