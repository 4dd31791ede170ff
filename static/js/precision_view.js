// The "precision" inspection in the explorer's Inside panel: one step's next-token distribution
// under the served weights and under the same model in another precision, side by side, with
// the KL divergence per step. Owns: drawing it. Must not know: requests (inside.js asks).
import { h } from "./dom.js";
import { fmtProb, visiblePiece } from "./format.js";

export const PRECISIONS = ["float32", "bfloat16", "int8", "int4"];

export const EXPLAIN = "Decode reads every weight once per token, so storing weights in fewer bits (bfloat16: 2 bytes, "
  + "int8: 1, int4: half a byte) makes it faster. The price is a slightly different model: here the same text is "
  + "read by both, and each step's next-token distributions are compared. KL divergence measures how different they "
  + "are, in nats (0: identical).";

/** The other precision to compare with by default: float32 unless that is what is served. */
export function defaultOther(served) {
  return served === "float32" ? "int8" : "float32";
}

export function renderPrecision(r, target, onPick) {
  const step = r.steps[Math.min(target.step, r.steps.length - 1)];
  const pick = h("select", { id: "precision-other", "aria-label": "compare with" },
    ...PRECISIONS.map((p) => h("option", { value: p, selected: p === r.other_precision }, p)));
  pick.addEventListener("change", () => onPick(pick.value));
  const head = h("p", { class: "small" }, `Served in ${r.served_precision}; compared with `, pick,
    `. Over ${r.steps.length} steps: mean KL `, h("b", { id: "precision-mean-kl" }, r.mean_kl.toExponential(2)),
    ` nats, the most likely token differs at ${r.num_top_flips} step${r.num_top_flips === 1 ? "" : "s"}.`);
  const strip = h("div", { class: "prob-strip", title: "KL divergence per step (taller: more different)" },
    ...r.steps.map((s) => h("span", { class: s.index === step.index ? "current" : "", dataset: { kl: s.kl },
      style: `--p: ${Math.min(1, s.kl / Math.max(r.max_kl, 1e-12)).toFixed(3)}`, title: `step ${s.index}: KL ${s.kl.toExponential(2)}` })));
  const rows = step.served.top.map((a, i) => {
    const b = step.other.top[i];
    return h("tr", { class: a.token_id === step.token_id ? "chosen" : "" },
      h("td", { class: "num" }, i + 1), h("td", {}, visiblePiece(a.piece)), h("td", { class: "num" }, fmtProb(Math.exp(a.logprob))),
      h("td", {}, b ? visiblePiece(b.piece) : ""), h("td", { class: "num" }, b ? fmtProb(Math.exp(b.logprob)) : ""));
  });
  const table = h("table", { class: "inside-table", id: "precision-table" },
    h("thead", {}, h("tr", {}, ...["rank", r.served_precision, "p", r.other_precision, "p"].map((t) => h("th", {}, t)))),
    h("tbody", {}, ...rows));
  const summary = h("p", { class: "small" }, `Step ${step.index} (“${visiblePiece(step.piece)}”): KL `,
    h("b", { id: "precision-step-kl" }, step.kl.toExponential(2)), ` nats; the generated token has p ${fmtProb(Math.exp(step.served.token_logprob))} served, `,
    `${fmtProb(Math.exp(step.other.token_logprob))} in ${r.other_precision}.`);
  return h("div", { class: "inside-view", id: "inside-precision" }, head, strip, summary, table);
}
