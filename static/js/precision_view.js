// The "precision" inspection in the explorer's Inside panel: one step's next-token distribution
// under the served weights and under the same model in another precision, side by side, with
// the KL divergence per step. Owns: drawing it. Must not know: requests (inside.js asks).
import { h } from "./dom.js";
import { fmtProb, visiblePiece } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

export const PRECISIONS = ["float32", "bfloat16", "int8", "int4", "gguf"];

export const EXPLAIN = gettext("Decode reads every weight once per token, so storing weights in fewer bits (bfloat16: 2 bytes, "
  + "int8: 1, int4: half a byte; gguf: each tensor as its GGUF file stores it, 4.5 to 8.5 bits) makes it faster. "
  + "The price is a slightly different model: here the same text is "
  + "read by both, and each step's next-token distributions are compared. KL divergence measures how different they "
  + "are, in nats (0: identical).");

/** The other precision to compare with by default: float32 unless that is what is served. */
export function defaultOther(served) {
  return served === "float32" ? "int8" : "float32";
}

export function renderPrecision(r, target, onPick) {
  const step = r.steps[Math.min(target.step, r.steps.length - 1)];
  const pick = h("select", { id: "precision-other", "aria-label": gettext("compare with") },
    ...PRECISIONS.map((p) => h("option", { value: p, selected: p === r.other_precision }, p)));
  pick.addEventListener("change", () => onPick(pick.value));
  const head = h("p", { class: "small" }, interpolate(gettext("Served in %(precision)s; compared with"), { precision: r.served_precision }), " ", pick,
    ". ", interpolate(gettext("Over %(n)s steps: mean KL"), { n: r.steps.length }), " ", h("b", { id: "precision-mean-kl" }, r.mean_kl.toExponential(2)),
    " ", interpolate(ngettext("nats, the most likely token differs at %(n)s step.", "nats, the most likely token differs at %(n)s steps.", r.num_top_flips),
      { n: r.num_top_flips }));
  const strip = h("div", { class: "prob-strip", title: gettext("KL divergence per step (taller: more different)") },
    ...r.steps.map((s) => h("span", { class: s.index === step.index ? "current" : "", dataset: { kl: s.kl },
      style: `--p: ${Math.min(1, s.kl / Math.max(r.max_kl, 1e-12)).toFixed(3)}`, title: interpolate(gettext("step %(step)s: KL %(kl)s"), { step: s.index, kl: s.kl.toExponential(2) }) })));
  const rows = step.served.top.map((a, i) => {
    const b = step.other.top[i];
    return h("tr", { class: a.token_id === step.token_id ? "chosen" : "" },
      h("td", { class: "num" }, i + 1), h("td", {}, visiblePiece(a.piece)), h("td", { class: "num" }, fmtProb(Math.exp(a.logprob))),
      h("td", {}, b ? visiblePiece(b.piece) : ""), h("td", { class: "num" }, b ? fmtProb(Math.exp(b.logprob)) : ""));
  });
  const table = h("table", { class: "inside-table", id: "precision-table" },
    h("thead", {}, h("tr", {}, ...[gettext("rank"), r.served_precision, "p", r.other_precision, "p"].map((t) => h("th", {}, t)))),
    h("tbody", {}, ...rows));
  const summary = h("p", { class: "small" }, interpolate(gettext("Step %(step)s (“%(piece)s”): KL"), { step: step.index, piece: visiblePiece(step.piece) }), " ",
    h("b", { id: "precision-step-kl" }, step.kl.toExponential(2)), " ",
    interpolate(gettext("nats; the generated token has p %(served)s served, %(other)s in %(precision)s."),
      { served: fmtProb(Math.exp(step.served.token_logprob)), other: fmtProb(Math.exp(step.other.token_logprob)), precision: r.other_precision }));
  return h("div", { class: "inside-view", id: "inside-precision" }, head, strip, summary, table);
}
