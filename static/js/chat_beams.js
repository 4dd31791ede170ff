// Beam search in the chat. Owns: turning a beam search's records (its streamed `beam_step`s
// and the returned sequences in `stats.sequences`, docs/protocol.md) into the answer's token
// records that the popover and the colour toggle read, the popover card of such a token, and
// the expandable list of the final hypotheses with the search tree. No requests, no page state.
import { beamTree } from "./beam_tree.js";
import { h } from "./dom.js";
import { fmtNum, fmtProb, numSteps, visiblePiece } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";
import { isBeamStep } from "./run_state.js";

const MAX_BEAM_TEXT = 48;

const sameIds = (a, b) => a.length === b.length && a.every((id, i) => id === b[i]);

/**
 * The answer's tokens as step records: the chosen sequence's tokens, each one's text, the
 * log-probability the search scored it with and the running sum, and the beams alive after
 * that step (`onPath`: the one the answer went through).
 */
export function beamAnswerSteps(sequence, beamSteps) {
  if (!sequence?.text_deltas?.length) return [];
  let sum = 0;
  return sequence.token_ids.map((tokenId, i) => {
    sum += sequence.token_logprobs[i];
    const prefix = sequence.token_ids.slice(0, i + 1);
    const beams = (beamSteps[i]?.beams ?? []).map((b) => ({ ...b, onPath: sameIds(b.token_ids, prefix) }));
    return { index: i, isBeam: true, token_id: tokenId, piece: sequence.text_deltas[i], text_delta: sequence.text_deltas[i],
      logprob: sequence.token_logprobs[i], logprob_sum: sum, beams };
  });
}

/** Put a generation's saved or re-attached `steps` on `message`: beam steps, or token steps. */
export function setRecordedSteps(message, steps, stats) {
  if (!isBeamStep(steps[0])) {
    message.steps = steps;
    return;
  }
  message.beamSteps = steps;
  message.steps = beamAnswerSteps(stats?.sequences?.[0], steps);
}

/** The popover card of one token of a beam-search answer. */
export function beamTokenDetails(step) {
  return h("div", { class: "beam-token" },
    h("div", { class: "popover-head" },
      h("span", { class: "piece" }, visiblePiece(step.piece)),
      h("span", { class: "muted small" }, `id ${step.token_id} · ${interpolate(gettext("beam step %(step)s"), { step: step.index })}`)),
    h("div", { class: "popover-meta" },
      h("span", {}, "p ", h("b", { dataset: { field: "prob" } }, fmtProb(Math.exp(step.logprob))), " ", gettext("along the beam")),
      h("span", {}, "log p ", h("b", { dataset: { field: "logprob" } }, fmtNum(step.logprob, 3))),
      h("span", {}, gettext("sum so far"), " ", h("b", { dataset: { field: "logprob-sum" } }, fmtNum(step.logprob_sum, 3)))),
    h("p", { class: "muted small beam-note" }, gettext("Beam search samples nothing: it keeps the best few paths by their summed "
      + "log-probability. p is this token's probability under the model after the beam's earlier tokens. The beams after this step:")),
    h("table", { class: "alt-table" },
      h("thead", {}, h("tr", {}, h("th", {}, gettext("beam")), h("th", { class: "num" }, gettext("score")))),
      h("tbody", {}, step.beams.map((b) => h("tr", { class: b.onPath ? "chosen" : "" },
        h("td", { class: "mono" }, tail(b.text), b.is_finished ? h("span", { class: "muted" }, " ", gettext("(finished)")) : null),
        h("td", { class: "num" }, fmtNum(b.score, 3)))))));
}

function tail(text) {
  const shown = visiblePiece(text);
  return shown.length > MAX_BEAM_TEXT ? `…${shown.slice(-MAX_BEAM_TEXT + 1)}` : shown;
}

/** The hypotheses the search ended with, best first: every beam that finished (and the returned
 * sequences, which a cancelled search takes from the live beams), at most `num_beams`. */
export function finalHypotheses(beamSteps, sequences = []) {
  const numBeams = Math.max(1, ...beamSteps.map((s) => s.beams.filter((b) => !b.is_finished).length));
  const byIds = new Map();
  for (const beam of [...sequences, ...beamSteps.flatMap((s) => s.beams.filter((b) => b.is_finished))]) {
    byIds.set(beam.token_ids.join(","), beam);
  }
  return { numBeams, hypotheses: [...byIds.values()].sort((a, b) => b.score - a.score).slice(0, numBeams) };
}

/** The expandable "Beam search" panel under an answer; null when it was not a beam search. */
export function beamsPanel(message) {
  const beamSteps = message.beamSteps;
  if (!beamSteps.length) return null;
  const sequences = message.stats?.sequences ?? [];
  const chosen = sequences[0]?.token_ids ?? null;
  const { numBeams, hypotheses } = finalHypotheses(beamSteps, sequences);
  // The tree is drawn only while the panel is open: a streaming answer redraws this every frame.
  const tree = h("div", { class: "beam-tree" });
  const drawTree = () => tree.replaceChildren(...(message.isBeamsOpen ? [beamTree(beamSteps, chosen)] : []));
  const details = h("details", { class: "beam-panel", open: message.isBeamsOpen,
    ontoggle: () => { message.isBeamsOpen = details.open; drawTree(); } },
    h("summary", {}, interpolate(ngettext("Beam search · %(beams)s beam", "Beam search · %(beams)s beams", numBeams), { beams: numBeams }),
      " · ", numSteps(beamSteps.length),
      " · ", message.isStreaming ? gettext("searching…") : interpolate(gettext("%(n)s hypotheses"), { n: hypotheses.length })),
    h("ol", { class: "beam-list" }, hypotheses.map((beam) => {
      const isChosen = chosen !== null && sameIds(beam.token_ids, chosen);
      return h("li", { class: isChosen ? "chosen" : "", dataset: { score: beam.score } },
        h("span", { class: "badge" }, isChosen ? gettext("answer") : interpolate(gettext("%(n)s tok"), { n: beam.token_ids.length })), " ",
        h("span", { class: "mono" }, tail(beam.text)),
        h("span", { class: "muted beam-score" }, " ", interpolate(gettext("score %(score)s"), { score: fmtNum(beam.score, 3) })));
    })),
    h("p", { class: "muted small" }, gettext("score = the beam's summed log-probability ÷ its length ^ length penalty. "
      + "The tree: one column per step, one box per beam; the answer's path is highlighted.")),
    tree);
  drawTree();
  return details;
}
