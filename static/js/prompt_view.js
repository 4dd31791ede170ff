// The exact prompt the model saw: rendered text with role markers and special tokens
// highlighted, then its tokens (piece, id, bytes on hover), the prefix-cache hits marked;
// each image is one block of image tokens (its patch grid, the count, the KV bytes it takes).
// Owns: presentation of a `generation.started` `prompt` record; shared by both pages.
import { h } from "./dom.js";
import { fmtBytes, spacedHex, tokenLabel } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

const SPECIAL_PIECE = /^<\|[^|\s]*\|>$|^<\/?s>$|^<\/?think>$/;

/** The prompt text as a <pre>, each span's kind as a class (role / special / content). */
export function promptText(prompt) {
  const pre = h("pre", { class: "prompt-text" });
  const text = prompt.text || "";
  let pos = 0;
  for (const span of [...(prompt.spans || [])].sort((a, b) => a.start - b.start)) {
    if (span.start > pos) pre.append(text.slice(pos, span.start));
    const part = text.slice(Math.max(span.start, pos), span.end);
    if (span.kind === "content") pre.append(part);
    else pre.append(h("span", { class: `span-${span.kind}`, title: span.role ? `${span.kind} (${span.role})` : span.kind }, part));
    pos = Math.max(pos, span.end);
  }
  if (pos < text.length) pre.append(text.slice(pos));
  return pre;
}

/** One image's tokens as a block: a cell per patch (one token each), the count and KV bytes. */
export function imageBlock(image, numCachedTokens = 0) {
  const [rows, cols] = image.grid;
  const isCached = image.start + image.num_tokens <= numCachedTokens;
  const cells = h("span", { class: "image-grid", style: `grid-template-columns: repeat(${cols}, 1fr)` },
    Array.from({ length: rows * cols }, () => h("span", { class: "image-cell" })));
  return h("span", {
    class: `image-block${isCached ? " cached" : ""}`,
    dataset: { numTokens: image.num_tokens, start: image.start },
    title: `#${image.start}–${image.start + image.num_tokens - 1} · `
      + interpolate(gettext("a %(width)s×%(height)s image as %(rows)s×%(cols)s patches, one token each"),
        { width: image.width, height: image.height, rows, cols })
      + ` · sha256 ${image.content_hash.slice(0, 12)}…` + (isCached ? ` · ${gettext("from the prefix cache")}` : ""),
  }, cells,
  h("span", { class: "image-label" },
    h("strong", { class: "image-count" }, interpolate(gettext("%(n)s image tokens"), { n: image.num_tokens })),
    h("span", { class: "chip-id" }, interpolate(gettext("%(rows)s×%(cols)s patches · %(bytes)s KV"), { rows, cols, bytes: fmtBytes(image.kv_bytes) }))));
}

/** Token chips; the first `numCachedTokens` came from the prefix cache; `images` (blocks of
 * image tokens, from the prompt record) are drawn as one block each. */
export function tokenChips(tokens, numCachedTokens = 0, images = []) {
  const imageAt = new Map(images.map((image) => [image.start, image]));
  const items = [];
  for (let i = 0; i < tokens.length; i += 1) {
    const image = imageAt.get(i);
    if (image) { items.push(imageBlock(image, numCachedTokens)); i += image.num_tokens - 1; continue; }
    items.push(tokenChip(tokens[i], i, numCachedTokens));
  }
  return h("div", { class: "token-chips" }, items);
}

function tokenChip(tok, i, numCachedTokens) {
  const classes = ["chip"];
  if (i < numCachedTokens) classes.push("cached");
  if (SPECIAL_PIECE.test(tok.piece)) classes.push("special");
  const cached = i < numCachedTokens ? ` · ${gettext("from the prefix cache")}` : "";
  return h("span", { class: classes.join(" "), title: `#${i} · id ${tok.id} · ${interpolate(gettext("bytes %(hex)s"), { hex: spacedHex(tok.bytes) })}${cached}` },
    h("span", { class: "chip-piece" }, tokenLabel(tok.piece, tok.bytes)),
    h("span", { class: "chip-id" }, tok.id));
}

export function legend(numTokens, numCachedTokens) {
  return h("div", { class: "legend" },
    h("span", {}, h("span", { class: "swatch", style: "background: var(--role)" }), gettext("template text (role markers)")),
    h("span", {}, h("span", { class: "swatch", style: "background: var(--special)" }), gettext("special token")),
    numCachedTokens > 0
      ? h("span", {}, h("span", { class: "swatch", style: "background: var(--cached)" }),
        interpolate(gettext("%(cached)s of %(n)s tokens from the prefix cache"), { cached: numCachedTokens, n: numTokens }))
      : h("span", {}, interpolate(gettext("%(n)s tokens, none from the prefix cache"), { n: numTokens })));
}

/** What the template left out: earlier answers' `<think>` reasoning (R1's drops it), or null. */
export function droppedReasoningNote(prompt) {
  const n = prompt.dropped_reasoning?.length ?? 0;
  if (!n) return null;
  return h("p", { class: "hint small dropped-reasoning" },
    interpolate(ngettext("The chat template dropped the reasoning of %(n)s earlier answer from the history (as DeepSeek-R1's template requires): the model does not see it, only the answers.",
      "The chat template dropped the reasoning of %(n)s earlier answers from the history (as DeepSeek-R1's template requires): the model does not see it, only the answers.", n), { n }));
}

/** A chat that outgrew the limits: its oldest messages were left out of this prompt, or null. */
export function droppedMessagesNote(prompt) {
  const n = prompt.num_dropped_messages ?? 0;
  if (!n) return null;
  return h("p", { class: "hint small dropped-messages" },
    interpolate(ngettext("The conversation no longer fits the model's context: its %(n)s oldest message was left "
      + "out of this prompt, so the model does not see it.",
    "The conversation no longer fits the model's context: its %(n)s oldest messages were left out of this prompt, "
      + "so the model does not see them.", n), { n }));
}

/** The whole view: legend, what was left out, text, tokens. */
export function promptView(prompt, numCachedTokens = 0) {
  const tokens = prompt.tokens || [];
  return h("div", { class: "prompt-view" },
    legend(tokens.length, numCachedTokens),
    droppedMessagesNote(prompt),
    droppedReasoningNote(prompt),
    promptText(prompt),
    h("p", { class: "panel-title" }, interpolate(gettext("Tokens (%(n)s)"), { n: tokens.length })),
    tokenChips(tokens, numCachedTokens, prompt.images || []));
}
