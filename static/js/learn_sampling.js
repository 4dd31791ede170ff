// Lesson section 6, sampling strategies: one text continued under argmax, three temperatures,
// top-k, top-p (several seeded draws each) and beam search, side by side with the first
// token's distribution each strategy actually drew from (the step's `top_processed`).
// Owns: the strategies and that table. Requests go through LessonRunner (two at a time).
import { $, h } from "./dom.js";
import { explorerUrl } from "./explorer_url.js";
import { fmtProb, tokenLabel } from "./format.js";
import { gettext, interpolate } from "./i18n.js";
import { measure, numbers, progress, runSection, shownText } from "./learn_view.js";

const NUM_SHOWN = 5;  // tokens of the first step's distribution shown per strategy
const NUM_ALTERNATIVES = 10;

/** name, the overrides that make it, whether draws differ (seeded), the explorer's settings. */
function strategies() {
  const sampled = (settings) => ({ greedy: false, temperature: 1, top_k: 0, top_p: 1, min_p: 0, ...settings });
  return [
    { key: "argmax", name: gettext("Argmax (greedy)"), overrides: { greedy: true }, isDrawn: false, link: { temperature: 0 } },
    { key: "t03", name: interpolate(gettext("Temperature %(t)s"), { t: "0.3" }), overrides: sampled({ temperature: 0.3 }), isDrawn: true, link: { temperature: 0.3 } },
    { key: "t10", name: interpolate(gettext("Temperature %(t)s"), { t: "1.0" }), overrides: sampled({}), isDrawn: true, link: { temperature: 1 } },
    { key: "t15", name: interpolate(gettext("Temperature %(t)s"), { t: "1.5" }), overrides: sampled({ temperature: 1.5 }), isDrawn: true, link: { temperature: 1.5 } },
    { key: "topk", name: interpolate(gettext("Top-k %(k)s"), { k: 5 }), overrides: sampled({ top_k: 5 }), isDrawn: true, link: { temperature: 1, top_k: 5 } },
    { key: "topp", name: interpolate(gettext("Top-p %(p)s"), { p: "0.9" }), overrides: sampled({ top_p: 0.9 }), isDrawn: true, link: { temperature: 1, top_p: 0.9 } },
    { key: "beam", name: interpolate(gettext("Beam search, %(n)s beams"), { n: 3 }), overrides: { num_beams: 3, num_return_sequences: 1 },
      isDrawn: false, link: { beams: 3 } },
  ];
}

export function setupSampling(runner) {
  const section = $("#learn-sampling");
  const result = $("#ls-result");

  $("#ls-run").addEventListener("click", () => runSection(section, result, async () => {
    const text = $("#ls-text").value;
    const numTokens = Number($("#ls-tokens").value);
    const numDraws = Number($("#ls-draws").value);
    result.replaceChildren(progress());
    const rows = strategies().map((strategy) => {
      const seeds = strategy.isDrawn ? Array.from({ length: numDraws }, (_, i) => i + 1) : [null];
      const runs = seeds.map((seed) => runner.complete({ text, overrides: { max_new_tokens: numTokens, repetition_penalty: 1.0,
        num_alternatives: NUM_ALTERNATIVES, ...strategy.overrides, ...(seed === null ? {} : { seed }) } }).then((run) => ({ ...run, seed })));
      return { strategy, runs };
    });
    for (const row of rows) row.runs = await Promise.all(row.runs);
    const raw = rows[0].runs[0].steps[0].top_raw;
    result.replaceChildren(
      h("p", { class: "learn-sub" }, gettext("The model's own distribution of the first token (the same for every strategy)")),
      distribution(raw.slice(0, NUM_ALTERNATIVES), "raw"),
      h("div", { class: "learn-table-wrap" }, h("table", { class: "learn-table", id: "ls-table" },
        h("thead", {}, h("tr", {}, [gettext("Strategy"), gettext("First token: what it drew from"), gettext("Draws"), gettext("Distinct")]
          .map((name) => h("th", {}, name)))),
        h("tbody", {}, rows.map((row) => strategyRow(row, text, numTokens))))));
  }));
}

function distribution(alternatives, kind) {
  return h("div", { class: "learn-dist compact", dataset: { kind } }, alternatives.map((alt) =>
    h("div", { class: "learn-dist-row", dataset: { tokenId: alt.token_id, prob: alt.prob } },
      h("span", { class: "piece" }, tokenLabel(alt.piece)),
      h("span", { class: "learn-bar" }, h("span", { style: `width: ${(alt.prob * 100).toFixed(1)}%` })),
      h("span", { class: "num" }, fmtProb(alt.prob)))));
}

function strategyRow({ strategy, runs }, text, numTokens) {
  const texts = runs.map((run) => run.text);
  const numDistinct = new Set(texts).size;
  const isBeam = strategy.key === "beam";
  const first = strategy.isDrawn ? runs[0].steps[0] : null;
  const kept = first ? first.top_processed.filter((alt) => alt.prob > 0) : [];
  const link = explorerUrl({ text, chat: false, run: Math.min(numTokens, 64), seed: runs[0].seed ?? undefined, ...strategy.link });
  return h("tr", { dataset: { strategy: strategy.key } },
    h("th", { scope: "row" }, h("a", { href: link }, strategy.name)),
    h("td", {}, !first ? h("span", { class: "muted small" }, isBeam ? gettext("no draw: the search keeps the 3 best paths by total probability")
      : gettext("no draw: always the most likely token"))
      : [distribution(kept.slice(0, NUM_SHOWN), "processed"),
        h("span", { class: "muted small" }, interpolate(gettext("%(n)s of the model's top %(top)s can still be drawn"), { n: kept.length, top: NUM_ALTERNATIVES }))]),
    h("td", {}, h("ol", { class: "learn-draws" }, runs.map(drawItem))),
    h("td", { class: "num" }, distinctCell(strategy, numDistinct, runs.length)));
}

/** One run's text (a character its end cut left out), with its seed when it drew. */
function drawItem(run) {
  const { text, cut } = shownText(run);
  return h("li", { dataset: { generationId: run.generation_id, seed: run.seed ?? "" } },
    h("span", { class: "learn-draw" }, text || "∅"), cut,
    run.seed === null ? null : h("span", { class: "muted small" }, " ", interpolate(gettext("seed %(seed)s"), { seed: run.seed })));
}

/** How many of the draws differ; a strategy that draws nothing runs once ("1/1" said nothing). */
function distinctCell(strategy, numDistinct, numRuns) {
  if (!strategy.isDrawn) return h("span", { class: "muted small learn-same" }, gettext("always the same: nothing is drawn"));
  return numbers([measure(`${strategy.key}_distinct`, gettext("distinct"), `${numDistinct}/${numRuns}`, numDistinct)]);
}
