// Lesson section 2, the KV Cache: the same greedy continuation with the cache and without it
// (`use_kv_cache`), one run after the other so they do not share the machine, each decode
// step's latency drawn side by side, and the bytes the cache holds. Owns: that comparison.
import { $, h } from "./dom.js";
import { baseOptions, applyTheme, css } from "./explorer_charts.js";
import { explorerUrl } from "./explorer_url.js";
import { fmtBytes, fmtMs } from "./format.js";
import { gettext, interpolate } from "./i18n.js";
import { measure, numbers, progress, runSection } from "./learn_view.js";

const TAIL = 8;  // "the last steps" average over this many
// A line whose last steps are within this factor of its first step "stayed about flat": the
// verdict says what the measured lines did (a no-cache line was once flat where a fixed
// sentence said it climbed), and a busy CPU's step times wander by about this much.
const FLAT = 1.15;

export function setupKv(runner) {
  const section = $("#learn-kv");
  const result = $("#lk-result");
  let chart = null;

  $("#lk-run").addEventListener("click", () => runSection(section, result, async () => {
    const text = $("#lk-text").value;
    const numTokens = Number($("#lk-tokens").value);
    const canvas = h("canvas", { id: "lk-chart" });
    const status = progress(gettext("With the KV Cache…"));
    result.replaceChildren(status, h("div", { class: "chart-box learn-chart" }, canvas));
    chart?.destroy();
    chart = latencyChart(canvas);
    const overrides = (useCache) => ({ greedy: true, max_new_tokens: numTokens, ignore_eos: true,
      use_kv_cache: useCache, use_prefix_cache: false, num_alternatives: 1 });
    const live = (index) => (run) => { setSeries(chart, index, run.steps); };
    const cached = await runner.complete({ text, overrides: overrides(true) }, { onStep: live(0) });
    status.textContent = gettext("Without the cache: every step recomputes the whole text…");
    const uncached = await runner.complete({ text, overrides: overrides(false) }, { onStep: live(1) });
    setSeries(chart, 0, cached.steps);
    setSeries(chart, 1, uncached.steps);
    status.replaceWith(summary(cached, uncached));
    $("#lk-link").href = explorerUrl({ text, chat: false, temperature: 0, run: Math.min(numTokens, 64), kv_cache: false,
      prefix_cache: false });
  }));
}

function latencyChart(canvas) {
  applyTheme();
  const line = (label, colour) => ({ label, data: [], borderColor: css(colour), backgroundColor: css(colour),
    pointRadius: 0, borderWidth: 2, tension: 0.2 });
  return new window.Chart(canvas, {
    type: "line",
    data: { labels: [], datasets: [line(gettext("with the KV Cache"), "--decode"), line(gettext("without a cache"), "--prefill")] },
    options: baseOptions({
      plugins: { legend: { display: true, position: "top", align: "end", labels: { boxWidth: 10, boxHeight: 10 } },
        tooltip: { callbacks: { label: (ctx) => `${ctx.dataset.label}: ${fmtMs(ctx.parsed.y)}` } } },
      scales: {
        x: { title: { display: true, text: gettext("decode step") } },
        y: { min: 0, title: { display: true, text: gettext("step latency (ms)") } },
      },
    }),
  });
}

/** Decode steps only: step 0 is the prefill, which both runs share. */
function setSeries(chart, index, steps) {
  const decode = steps.filter((s) => s.phase === "decode");
  chart.data.datasets[index].data = decode.map((s) => s.latency_ms);
  const longest = Math.max(...chart.data.datasets.map((d) => d.data.length));
  chart.data.labels = Array.from({ length: longest }, (_, i) => i + 1);
  chart.update();
}

const mean = (values) => values.reduce((sum, v) => sum + v, 0) / Math.max(1, values.length);
const decodeMs = (run) => run.steps.filter((s) => s.phase === "decode").map((s) => s.latency_ms);

/** A run's first decode step, the mean of its last TAIL, and last ÷ first (null without a first). */
function lineEnds(run) {
  const decode = decodeMs(run);
  const first = decode[0] ?? null;
  const last = mean(decode.slice(-TAIL));
  return { decode, first, last, growth: first ? last / first : null };
}

function runNumbers(run, prefix, label) {
  const { decode, first, last } = lineEnds(run);
  return [
    h("p", { class: "learn-sub" }, label),
    numbers([
      measure(`${prefix}_first_ms`, gettext("first decode step"), fmtMs(first), first),
      measure(`${prefix}_last_ms`, interpolate(gettext("last %(n)s steps, mean"), { n: Math.min(TAIL, decode.length) }), fmtMs(last), last),
      measure(`${prefix}_growth`, gettext("last ÷ first"), first ? `${(last / first).toFixed(1)}×` : "–", first ? last / first : null),
      measure(`${prefix}_decode_tok_s`, gettext("decode speed"), `${(run.stats.decode_tok_s ?? 0).toFixed(1)} tok/s`,
        run.stats.decode_tok_s),
      measure(`${prefix}_kv_bytes`, gettext("KV Cache after the last step"), fmtBytes(run.steps.at(-1).kv_cache_bytes),
        run.steps.at(-1).kv_cache_bytes),
    ]),
  ];
}

function summary(cached, uncached) {
  const model = cached.model;
  const lastKv = cached.steps.at(-1).kv_cache_bytes;
  const numCachedTokens = Math.round(lastKv / model.kv_bytes_per_token);
  const isSame = cached.steps.length === uncached.steps.length
    && cached.steps.every((s, i) => s.token_id === uncached.steps[i].token_id);
  return h("div", { class: "learn-summary" },
    runNumbers(cached, "cached", gettext("With the KV Cache")),
    runNumbers(uncached, "uncached", gettext("Without a cache")),
    numbers([
      measure("kv_bytes_per_token", gettext("KV Cache per token"), fmtBytes(model.kv_bytes_per_token), model.kv_bytes_per_token,
        gettext("keys and values of every layer for one token, measured by the worker")),
      measure("same_tokens", gettext("same tokens both ways"), isSame ? gettext("yes") : gettext("no"), isSame ? 1 : 0),
    ]),
    h("p", { class: "learn-verdict" }, interpolate(gettext("The cache held %(bytes)s for %(n)s tokens (%(per)s each). Without it nothing is stored and every step recomputes all of them."),
      { bytes: fmtBytes(lastKv), n: numCachedTokens, per: fmtBytes(model.kv_bytes_per_token) }),
    " ", trends(cached, uncached),
    " ", isSame ? gettext("Both runs wrote the same tokens: the cache changes the cost, not the result.")
      : gettext("The two runs wrote different tokens: the two computations round differently, and a near tie between two tokens can tip either way.")));
}

/**
 * What the two measured lines did, first decode step to the mean of the last ones (each sentence
 * carries data-line and data-trend: rose, fell or flat), and how they compare on average.
 */
function trends(cached, uncached) {
  const [withCache, without] = [lineEnds(cached), lineEnds(uncached)];
  if (withCache.growth === null || without.growth === null) return "";
  const said = (line, growth, sentences) => {
    const trend = growth >= FLAT ? "rose" : growth <= 1 / FLAT ? "fell" : "flat";
    return h("span", { dataset: { line, trend } }, interpolate(sentences[trend], { x: growth.toFixed(1) }));
  };
  return [
    said("uncached", without.growth, {
      rose: gettext("Without the cache the step time rose %(x)s× from the first decode step to the last ones;"),
      fell: gettext("Without the cache the step time fell to %(x)s× the first decode step's by the last ones;"),
      flat: gettext("Without the cache the step time stayed about flat (%(x)s× from the first decode step to the last ones);"),
    }), " ",
    said("cached", withCache.growth, {
      rose: gettext("with it, it rose %(x)s×."),
      fell: gettext("with it, it fell to %(x)s×."),
      flat: gettext("with it, it stayed about flat (%(x)s×)."),
    }), " ",
    interpolate(gettext("On average a step without the cache took %(ratio)s× as long as one with it."),
      { ratio: (mean(without.decode) / mean(withCache.decode)).toFixed(1) }),
  ];
}
