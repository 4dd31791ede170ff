// Speculative decoding as the pages show it (docs/protocol.md: a step's `verification`, the
// finished stats' `num_proposed_tokens`, `num_accepted_tokens`, `speculative_speedup`). Owns:
// grouping a run's steps into the forward passes that made them, the run's numbers (tokens per
// pass, acceptance rate, the estimated speedup), and the views the explorer and the lesson share:
// one pass's verdict, the strip of passes and its legend. Must not know requests or pages.
import { h } from "./dom.js";
import { fmtNum, fmtProb, visiblePiece } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

/** What proposed a pass's tokens, in the page's words (a draft model keeps its name). */
export function sourceLabel(source) {
  if (source === "prompt_lookup") return gettext("prompt lookup");
  if (source === "prediction") return gettext("prediction");
  return source;
}

/**
 * The forward passes that made `steps` (a run's token steps, in order), each
 * `{steps, verification, phase}`: a verified pass holds its accepted tokens and the model's own
 * token after them (`verification.position` 0, 1, …); a plain pass (the prefill, a decode step
 * without proposals) holds one token and `verification` null.
 */
export function passesOf(steps) {
  const passes = [];
  for (const step of steps) {
    const v = step.verification ?? null;
    const last = passes.at(-1);
    const isSamePass = v && last?.verification && v.position > 0 && last.steps.length === v.position
      && last.verification.num_accepted === v.num_accepted && last.verification.proposed.length === v.proposed.length;
    if (isSamePass) last.steps.push(step);
    else passes.push({ steps: [step], verification: v, phase: step.phase });
  }
  return passes;
}

/**
 * A run's speculation in numbers: the decode's tokens and forward passes (`tokensPerPass`), the
 * proposed and accepted tokens (the finished stats' when there, else counted from the steps),
 * the acceptance rate (null when nothing was proposed) and the estimated speedup (stats only).
 */
export function speculationSummary(steps, stats = null) {
  const decodePasses = passesOf(steps).filter((p) => p.phase !== "prefill");
  const numDecodeTokens = decodePasses.reduce((n, p) => n + p.steps.length, 0);
  let numProposed = 0;
  let numAccepted = 0;
  for (const pass of decodePasses) {
    if (!pass.verification) continue;
    numProposed += pass.verification.proposed.length;
    numAccepted += pass.verification.num_accepted;
  }
  if (stats?.num_proposed_tokens != null) {
    numProposed = stats.num_proposed_tokens;
    numAccepted = stats.num_accepted_tokens ?? 0;
  }
  return {
    numPasses: decodePasses.length,
    numVerifiedPasses: decodePasses.filter((p) => p.verification).length,
    numDecodeTokens,
    tokensPerPass: decodePasses.length ? numDecodeTokens / decodePasses.length : null,
    numProposed,
    numAccepted,
    acceptanceRate: numProposed ? numAccepted / numProposed : null,
    speedup: stats?.speculative_speedup ?? null,
  };
}

/** Whether finished stats say the answer speculated (tokens were proposed). */
export const didSpeculate = (stats) => (stats?.num_proposed_tokens ?? 0) > 0;

/** "73% accepted (22/30)" and "≈1.8× faster" for a finished answer's stats; null without speculation. */
export function speculationStatsText(stats) {
  if (!didSpeculate(stats)) return null;
  const rate = stats.num_accepted_tokens / stats.num_proposed_tokens;
  return {
    acceptance: interpolate(gettext("%(rate)s accepted (%(accepted)s/%(proposed)s)"),
      { rate: fmtProb(rate), accepted: stats.num_accepted_tokens, proposed: stats.num_proposed_tokens }),
    speedup: interpolate(gettext("≈%(x)s× faster"), { x: fmtNum(stats.speculative_speedup ?? 1, 2) }),
  };
}

/** One proposed token's chip: accepted (green), the first rejection (red, struck through) or not checked. */
function proposedChip(proposed, i, numAccepted, replacedBy) {
  const isRejected = i === numAccepted;
  const kind = proposed.is_accepted ? "accepted" : isRejected ? "rejected" : "unchecked";
  const probs = proposed.prob == null
    ? interpolate(gettext("proposer %(draft)s · the model did not reach it (after the first rejection)"), { draft: fmtProb(proposed.draft_prob) })
    : interpolate(gettext("proposer %(draft)s · model %(model)s"), { draft: fmtProb(proposed.draft_prob), model: fmtProb(proposed.prob) });
  const title = { accepted: gettext("accepted: the model's own choice here"),
    rejected: gettext("rejected: the model chose another token here; this pass keeps the model's token and drops the rest"),
    unchecked: gettext("not kept: it came after the first rejection") }[kind];
  const piece = visiblePiece(proposed.piece);
  return h("li", { class: `spec-prop spec-${kind}`, dataset: { accepted: proposed.is_accepted }, title: `${title} (${probs})` },
    h("span", { class: "spec-piece piece" }, kind === "accepted" ? piece : h("s", {}, piece)),
    isRejected && replacedBy ? h("span", { class: "spec-replaced" }, "→ ", h("span", { class: "spec-piece piece" }, visiblePiece(replacedBy))) : null,
    h("span", { class: "spec-probs" },
      h("span", { title: gettext("the proposer's probability of this token (1 for a lookup: it copies)") }, fmtProb(proposed.draft_prob)),
      " / ",
      h("span", { title: gettext("the model's probability of this token there") }, proposed.prob == null ? "–" : fmtProb(proposed.prob))));
}

/**
 * The verdict of the pass `step` came out of (null for a step without one): what proposed, the
 * proposed tokens (accepted ones green, the first rejection struck through with the model's token
 * that replaced it), the proposer's and the model's probability of each, and which token of the
 * pass this step is. `modelToken`: the piece the model chose after the accepted run, when known.
 */
export function verificationView(step, modelToken = null) {
  const v = step?.verification;
  if (!v) return null;
  const numProposed = v.proposed.length;
  const replacedBy = modelToken ?? (step.verification.position === v.num_accepted ? step.piece : null);
  const place = v.position < v.num_accepted
    ? interpolate(gettext("This token was proposed and accepted: token %(n)s of the pass."), { n: v.position + 1 })
    : v.num_accepted < numProposed
      ? gettext("This token is the model's own choice where it rejected a proposal: the pass ends with it.")
      : gettext("Every proposal was accepted; this token is the model's own next token, computed by the same pass.");
  return h("div", { class: "spec-view", dataset: { numAccepted: v.num_accepted, numProposed } },
    h("p", { class: "spec-head small" },
      h("b", {}, interpolate(gettext("Verified in one pass (%(source)s)"), { source: sourceLabel(v.source) })), " · ",
      interpolate(gettext("%(accepted)s of %(proposed)s proposed tokens accepted, %(n)s tokens from one forward pass"),
        { accepted: v.num_accepted, proposed: numProposed, n: v.num_accepted + 1 })),
    h("ol", { class: "spec-props", "aria-label": gettext("proposed tokens") },
      v.proposed.map((p, i) => proposedChip(p, i, v.num_accepted, replacedBy))),
    h("p", { class: "muted small spec-place" }, place, " ",
      gettext("Under each token: the proposer's probability / the model's.")));
}

/** The legend of the pass strip and the marks on tokens. */
export function speculationLegend() {
  return h("p", { class: "spec-legend muted small" },
    h("span", { class: "spec-swatch spec-accepted" }), gettext("proposed and accepted"), " ",
    h("span", { class: "spec-swatch spec-own" }), gettext("the model's own token (one per pass)"), " ",
    h("span", { class: "spec-swatch spec-rejected" }), gettext("first rejected proposal"));
}

/**
 * One box per forward pass of `steps`' decode: its tokens (accepted proposals green, then the
 * model's own token) and, where a proposal was rejected, that proposal struck through in red.
 * `onSelect(step)`: clicking a token; `selected`: the selected step's index.
 */
export function passStrip(steps, { onSelect = null, selected = null } = {}) {
  const passes = passesOf(steps).filter((p) => p.phase !== "prefill");
  const boxes = passes.map((pass, n) => {
    const v = pass.verification;
    const tokens = pass.steps.map((step) => {
      const isAccepted = v && step.verification.position < v.num_accepted;
      return h("span", { class: `spec-tok piece ${isAccepted ? "spec-accepted" : "spec-own"}${step.index === selected ? " selected" : ""}`,
        dataset: { step: step.index }, onclick: onSelect ? () => onSelect(step) : null,
        title: isAccepted ? gettext("proposed and accepted") : gettext("the model's own token") }, visiblePiece(step.piece));
    });
    const rejected = v && v.num_accepted < v.proposed.length ? v.proposed[v.num_accepted] : null;
    const title = v ? interpolate(gettext("pass %(n)s (%(source)s): %(accepted)s of %(proposed)s proposed accepted, %(tokens)s tokens"),
      { n: n + 1, source: sourceLabel(v.source), accepted: v.num_accepted, proposed: v.proposed.length, tokens: pass.steps.length })
      : interpolate(gettext("pass %(n)s: a plain decode step, nothing proposed"), { n: n + 1 });
    return h("span", { class: `spec-pass${v ? " verified" : ""}`, title, dataset: { numTokens: pass.steps.length, numAccepted: v?.num_accepted ?? 0 } },
      ...tokens, rejected ? h("s", { class: "spec-tok piece spec-rejected", title: gettext("first rejected proposal") }, visiblePiece(rejected.piece)) : null);
  });
  return h("div", { class: "spec-strip", role: "list", "aria-label": interpolate(ngettext("%(n)s forward pass", "%(n)s forward passes", passes.length), { n: passes.length }) }, boxes);
}
