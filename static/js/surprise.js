// Surprise, entropy and perplexity of generated text, and the strip drawn under an answer.
// Owns: the one definition of each number, from the log-probabilities the engine reports
// (natural logs): surprise = −log₂ p of the chosen token under the model's raw distribution
// (bits), the step's entropy in bits, perplexity = exp(mean −logprob). Used by the chat and
// the explorer; the prompt's log-probabilities come from the worker (`prompt_logprobs`).
import { api } from "./api.js";
import { h } from "./dom.js";
import { fmtNum, fmtProb, tokenLabel } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

// A cell is full height at this many bits (p = 1/256); higher surprises are clipped (the
// number in the hover text is not).
export const FULL_BITS = 8;

export const EXPLAIN = gettext("Each bar is one generated token: its height is the token's surprise, −log₂ p of the chosen "
  + "token under the model's raw distribution in bits (1 bit = as unexpected as a fair coin flip), and its line is "
  + "the step's entropy, the surprise the model expected on average before it chose.");
const PERPLEXITY = gettext("exp of the mean −log p: roughly how many equally likely tokens the model was choosing between");

/** −log₂ p from a natural-log probability. */
export function surpriseBits(logprob) {
  return -logprob / Math.LN2;
}

export function entropyBits(entropyNats) {
  return entropyNats / Math.LN2;
}

/** exp(mean −logprob) over the entries that have one (null ones, like a prompt's first token, are left out). */
export function perplexity(logprobs) {
  const known = logprobs.filter((lp) => lp !== null && lp !== undefined);
  if (!known.length) return null;
  return Math.exp(-known.reduce((sum, lp) => sum + lp, 0) / known.length);
}

/** The perplexity of generated steps: their chosen tokens under the raw distribution. */
export function answerPerplexity(steps) {
  return perplexity(steps.map((s) => s.raw_logprob));
}

/**
 * The prompt's perplexity, recomputed by a worker for a finished generation. `numTrailing`
 * prompt tokens at the end are not part of the text (the explorer's earlier tokens) and are
 * left out. -> {value, numPredicted, numTokens}
 */
export async function promptPerplexity(generationId, numTrailing = 0) {
  const result = await api("POST", `/api/generations/${generationId}/inspect/`, { view: "prompt_logprobs", top_n: 0 });
  const tokens = result.tokens.slice(0, result.tokens.length - numTrailing);
  const logprobs = tokens.map((t) => t.logprob);
  return { value: perplexity(logprobs), numPredicted: logprobs.filter((lp) => lp !== null).length, numTokens: tokens.length };
}

/** One line of hover text for a step. */
export function cellLabel(step) {
  return interpolate(gettext("“%(piece)s”: surprise %(surprise)s bits (p %(p)s) · entropy %(entropy)s bits"),
    { piece: tokenLabel(step.piece, step.token_bytes), surprise: fmtNum(surpriseBits(step.raw_logprob)),
      p: fmtProb(Math.exp(step.raw_logprob)), entropy: fmtNum(entropyBits(step.entropy)) });
}

/** The row of cells, one per step. */
export function surpriseCells(steps) {
  return h("div", { class: "strip-cells", role: "list", "aria-label": gettext("surprise and entropy per generated token") },
    steps.map((step) => {
      const cell = h("span", { class: "strip-cell", role: "listitem", dataset: { step: step.index },
        title: cellLabel(step), "aria-label": cellLabel(step) },
      h("span", { class: "strip-bar" }), h("span", { class: "strip-entropy" }));
      const height = (bits) => Math.min(bits / FULL_BITS, 1).toFixed(3);
      cell.style.setProperty("--surprise", height(surpriseBits(step.raw_logprob)));
      cell.style.setProperty("--entropy", height(entropyBits(step.entropy)));
      return cell;
    }));
}

/** "answer perplexity 3.21 over 12 tokens" */
export function answerSummary(steps) {
  return h("span", { class: "answer-ppl", title: interpolate(gettext("%(what)s, over the generated tokens (raw distribution)"), { what: PERPLEXITY }) },
    gettext("answer perplexity"), " ", h("b", {}, fmtNum(answerPerplexity(steps))), " ",
    interpolate(ngettext("over %(n)s token", "over %(n)s tokens", steps.length), { n: steps.length }));
}

/** The prompt's perplexity once known, with why one token has no prediction. */
export function promptSummary({ value, numPredicted, numTokens }) {
  return h("span", { class: "prompt-ppl", title: interpolate(gettext("%(what)s, over the prompt's tokens, each given the ones before it"), { what: PERPLEXITY }) },
    gettext("prompt perplexity"), " ", h("b", {}, fmtNum(value)), " ",
    interpolate(gettext("over %(n)s of %(total)s tokens (the first has nothing before it to predict it)"), { n: numPredicted, total: numTokens }));
}

/**
 * The strip under an answer: cells, summary line (answer perplexity, then `promptPart`, a
 * node the caller owns: the prompt's perplexity or the button that asks for it) and the
 * explanation.
 */
export function surpriseStrip(steps, promptPart = null) {
  return h("div", { class: "surprise-strip" },
    surpriseCells(steps),
    h("div", { class: "strip-summary small" }, answerSummary(steps), promptPart),
    h("p", { class: "strip-note muted small" }, EXPLAIN));
}
