// The floating card that explains one generated token: its probability, rank, entropy and
// the top alternatives, raw (the model's softmax) and processed (what was sampled from).
// Owns: showing/hiding on hover, tap and keyboard; it never fetches anything.
import { h } from "./dom.js";
import { fmtMs, fmtNum, fmtProb, phaseLabel, spacedHex, tokenLabel, visiblePiece } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

const MAX_ROWS = 12;
const HIDE_DELAY_MS = 180;

/** Rows for the alternatives table: raw top-k, plus the chosen token when it is not in it. */
export function alternativeRows(step) {
  const topRaw = step.top_raw || [];
  const topProcessed = step.top_processed || [];
  const processedById = new Map(topProcessed.map((a) => [a.token_id, a.prob]));
  // A shorter processed list means the filters (top-k/p, min-p) left fewer tokens than were
  // asked for, so a token missing from it was filtered out; otherwise it is merely unlisted.
  const missing = topProcessed.length < topRaw.length ? 0 : null;
  const rows = topRaw.slice(0, MAX_ROWS).map((alt, i) => ({
    rank: i + 1, tokenId: alt.token_id, piece: alt.piece, rawProb: alt.prob,
    processedProb: processedById.get(alt.token_id) ?? missing, isChosen: alt.token_id === step.token_id,
  }));
  if (!rows.some((r) => r.isChosen)) {
    rows.push({ rank: step.rank, tokenId: step.token_id, piece: step.piece, rawProb: Math.exp(step.raw_logprob),
      processedProb: Math.exp(step.logprob), isChosen: true });
  }
  return rows;
}

export function stepDetails(step) {
  const rows = alternativeRows(step);
  const maxProb = Math.max(...rows.map((r) => r.rawProb), 1e-9);
  return h("div", {},
    h("div", { class: "popover-head" },
      h("span", { class: "piece" }, tokenLabel(step.piece, step.token_bytes)),
      h("span", { class: "muted small" }, `id ${step.token_id} · ${interpolate(gettext("bytes %(hex)s"), { hex: spacedHex(step.token_bytes) })}`)),
    h("div", { class: "popover-meta" },
      h("span", {}, "p ", h("b", {}, fmtProb(Math.exp(step.raw_logprob))), " ", gettext("raw")),
      h("span", {}, h("b", {}, fmtProb(Math.exp(step.logprob))), " ", gettext("sampled")),
      h("span", {}, gettext("rank"), " ", h("b", {}, step.rank)),
      h("span", {}, gettext("entropy"), " ", h("b", {}, fmtNum(step.entropy)), " nats"),
      h("span", {}, h("b", {}, fmtMs(step.latency_ms)), ` ${phaseLabel(step.phase)}`),
      step.is_forced ? h("span", { class: "forced", title: gettext("the model ran; the thinking budget chose this token") },
        gettext("forced by the thinking budget")) : null),
    h("table", { class: "alt-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, gettext("token")), h("th", {}, gettext("raw")), h("th", {}, ""), h("th", {}, gettext("sampled")))),
      h("tbody", {}, rows.map((r) => h("tr", { class: r.isChosen ? "chosen" : "" },
        h("td", { class: "num muted" }, r.rank),
        h("td", {}, h("span", { class: "piece" }, visiblePiece(r.piece))),
        h("td", { style: "width: 70px" }, h("div", { class: "prob-bar raw", style: `width: ${(100 * r.rawProb) / maxProb}%` })),
        h("td", { class: "num" }, fmtProb(r.rawProb)),
        h("td", { class: "num" }, fmtProb(r.processedProb)))))));
}

/**
 * Hover (or tap) any `.tok[data-step]` inside `root` to see its step.
 * `findStep(tokenEl)` returns the step record for that element, or null; `details(step)` draws it.
 * `keepClear(tokenEl)` lists the elements the card must not cover (an answer's buttons): it goes
 * below the token, else above it, else below them, where it fits without covering them (below a
 * one-line answer it covered Regenerate and Copy, and stayed as the pointer crossed it to them).
 */
export class TokenPopover {
  constructor(root, findStep, details = stepDetails, keepClear = () => []) {
    this.findStep = findStep;
    this.details = details;
    this.keepClear = keepClear;
    this.el = h("div", { class: "popover", role: "tooltip", hidden: true, id: "token-popover" });
    document.body.append(this.el);
    this.anchor = null;
    this.hideTimer = null;
    root.addEventListener("pointerover", (e) => this.onOver(e));
    root.addEventListener("pointerout", (e) => e.target.closest?.(".tok") && this.scheduleHide());
    root.addEventListener("click", (e) => { const tok = e.target.closest(".tok"); if (tok) this.show(tok); });
    this.el.addEventListener("pointerenter", () => clearTimeout(this.hideTimer));
    this.el.addEventListener("pointerleave", () => this.scheduleHide());
    document.addEventListener("keydown", (e) => e.key === "Escape" && this.hide());
    document.addEventListener("pointerdown", (e) => {
      if (!this.el.contains(e.target) && !e.target.closest?.(".tok")) this.hide();
    });
  }

  onOver(event) {
    const tok = event.target.closest?.(".tok");
    if (tok && event.pointerType !== "touch") this.show(tok);
  }

  show(tok) {
    const step = this.findStep(tok);
    if (!step) return;
    clearTimeout(this.hideTimer);
    this.anchor?.classList.remove("active");
    this.anchor = tok;
    tok.classList.add("active");
    this.el.replaceChildren(this.details(step));
    this.el.hidden = false;
    this.place(tok.getBoundingClientRect(), [...this.keepClear(tok)].map((el) => el.getBoundingClientRect()));
  }

  /** Puts the card by the token's box `rect`, off the boxes in `clear` where it can be. */
  place(rect, clear = []) {
    const { width, height } = this.el.getBoundingClientRect();
    const left = Math.min(Math.max(8, rect.left), window.innerWidth - width - 8);
    const boxes = clear.filter((b) => b.width > 0 && b.height > 0);
    const fits = (top) => top >= 8 && top + height <= window.innerHeight - 8;
    const covers = (top) => boxes.some((b) => left < b.right && left + width > b.left && top < b.bottom && top + height > b.top);
    const below = rect.bottom + 6;
    const above = rect.top - height - 6;
    const underClear = Math.max(below, ...boxes.map((b) => b.bottom + 6));
    const top = [below, above, underClear].find((t) => fits(t) && !covers(t))
      ?? (below + height > window.innerHeight - 8 ? Math.max(8, above) : below);
    this.el.style.left = `${left}px`;
    this.el.style.top = `${top}px`;
  }

  scheduleHide() {
    clearTimeout(this.hideTimer);
    this.hideTimer = setTimeout(() => this.hide(), HIDE_DELAY_MS);
  }

  hide() {
    this.el.hidden = true;
    this.anchor?.classList.remove("active");
    this.anchor = null;
  }
}
