// The explorer's note beside a flat next-token distribution. Owns: when a step counts as flat
// and the words that explain why sampling from it starts answers so differently. Pure: the
// numbers come from the step record (the model's own top tokens) and the processed map.
import { h } from "./dom.js";
import { fmtNum, fmtProb, visiblePiece } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

export const FLAT_TOP_PROB = 0.3;  // the most likely token has less than this: no clear favourite
const NUM_SHOWN = 4;

export const isFlat = (step) => (step?.top_raw?.[0]?.prob ?? 1) < FLAT_TOP_PROB;

/** The note for `step`, or null when its distribution has a clear favourite. `processed` maps
 * token id -> probability under the sliders (as the distribution chart shows it). */
export function flatNote(step, processed) {
  if (!isFlat(step)) return null;
  const top = step.top_raw[0];
  const shown = step.top_raw.slice(0, NUM_SHOWN);
  const others = processed.isPending ? null : 1 - (processed.get(top.token_id) ?? 0);
  const piece = (alt) => h("span", { class: "piece" }, `“${visiblePiece(alt.piece)}”`);
  return h("div", { class: "dist-note", id: "ex-flat-note", role: "note" },
    h("b", {}, gettext("A flat distribution."), " "),
    gettext("No token is a clear favourite:"), " ",
    shown.flatMap((alt, i) => [i ? ", " : "", piece(alt), " ", h("span", { class: "note-prob", dataset: { tokenId: alt.token_id } },
      fmtProb(alt.prob))]),
    " ", interpolate(gettext("(entropy %(nats)s nats, like a choice between %(n)s equally likely tokens)."),
      { nats: fmtNum(step.entropy), n: fmtNum(Math.exp(step.entropy), 1) }), " ",
    gettext("Sampling from it picks something other than"), " ", piece(top), " ",
    h("b", { class: "note-others" }, others === null ? "…" : fmtProb(others)), " ", gettext("of the time with these settings,"), " ",
    gettext("and the first tokens steer the rest: a start the model rarely takes can lead into another language or a garbled answer."), " ",
    gettext("Greedy decoding or a lower temperature (which sharpens the distribution) avoids the rare starts."));
}
