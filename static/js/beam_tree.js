// Beam search as a tree: one column per step, one node per beam of that step (hypotheses
// that finished there are dashed), an edge from each to its parent in the previous step
// (generation.beams `parent`). Nodes on the best returned sequence are highlighted.
// Owns: the SVG layout only.
import { visiblePiece } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

const NS = "http://www.w3.org/2000/svg";
const COL_W = 118;
const ROW_H = 44;
const NODE_W = 100;
const NODE_H = 34;
const PAD = 12;

function el(tag, attrs, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const isPrefix = (short, long) => short.length <= long.length && short.every((id, i) => id === long[i]);

/** What a beam added over its parent: the new text, or its tail when the texts diverge. */
function newText(beam, parent) {
  if (parent && beam.text.startsWith(parent.text)) return beam.text.slice(parent.text.length);
  return beam.text.slice(-8);
}

function clip(text, max = 12) {
  const shown = visiblePiece(text);
  return shown.length > max ? `${shown.slice(0, max - 1)}…` : shown;
}

/**
 * @param {{index: number, beams: {token_ids: number[], text: string, score: number, parent: number, is_finished: boolean}[]}[]} beamSteps
 * @param {number[] | null} bestTokenIds the best returned sequence, when finished
 */
export function beamTree(beamSteps, bestTokenIds = null) {
  const numRows = Math.max(1, ...beamSteps.map((s) => s.beams.length));
  const width = PAD * 2 + COL_W * (beamSteps.length + 1);
  const height = PAD * 2 + ROW_H * numRows;
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": gettext("Beam search tree") });
  const at = (col, row) => ({ x: PAD + col * COL_W, y: PAD + row * ROW_H });

  const root = at(0, 0);
  svg.append(node(root, gettext("prompt"), "", "node root"));
  beamSteps.forEach((step, s) => {
    const previous = s > 0 ? beamSteps[s - 1].beams : null;
    step.beams.forEach((beam, b) => {
      const pos = at(s + 1, b);
      // `parent` indexes the previous step's live beams (listed first); -1 is the prompt.
      const parentPos = previous && beam.parent >= 0 ? at(s, beam.parent) : root;
      const mid = (parentPos.x + NODE_W + pos.x) / 2;
      svg.prepend(el("path", { class: "edge",
        d: `M${parentPos.x + NODE_W},${parentPos.y + NODE_H / 2} C${mid},${parentPos.y + NODE_H / 2} ${mid},${pos.y + NODE_H / 2} ${pos.x},${pos.y + NODE_H / 2}` }));
      const classes = ["node"];
      if (bestTokenIds && isPrefix(beam.token_ids, bestTokenIds)) classes.push("best");
      if (beam.is_finished) classes.push("finished");
      const label = clip(newText(beam, previous?.[beam.parent]));
      svg.append(node(pos, label, beam.score.toFixed(2), classes.join(" "), beam.text));
    });
  });
  return svg;
}

function node(pos, label, score, className, title = "") {
  const g = el("g", { class: className, transform: `translate(${pos.x},${pos.y})` });
  g.append(el("title", {}, title || label));
  g.append(el("rect", { width: NODE_W, height: NODE_H, rx: 5 }));
  g.append(el("text", { x: 8, y: score ? 14 : 21 }, label));
  if (score) g.append(el("text", { x: 8, y: 27, class: "score" }, interpolate(gettext("score %(score)s"), { score })));
  return g;
}
