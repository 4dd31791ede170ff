// Model output -> safe DOM. Owns: Markdown rendering, sanitizing, drawing <think> reasoning blocks
// (where they are comes from the server: `segments`, see inference/text/reasoning.py), and wrapping each generated token's characters in a hoverable <span class="tok">.
//
// Model text is untrusted: raw HTML in it is shown as text (the `html` renderer escapes it)
// and the Markdown output still goes through DOMPurify before it touches the page.
import { Marked } from "../vendor/marked/marked.esm.js";
import DOMPurify from "../vendor/dompurify/purify.es.mjs";
import { gettext } from "./i18n.js";

const escapeHtml = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const escapeAttr = (s) => escapeHtml(s).replace(/"/g, "&quot;").replace(/'/g, "&#39;");

const markdown = new Marked({
  gfm: true,
  renderer: {
    html(token) {
      const text = escapeHtml(token.text);
      return token.block ? `<p>${text}</p>\n` : text;
    },
    // An image in model output would make the browser fetch any URL the model (or a prompt
    // injection) names: show it as a link the user may choose to follow instead.
    image({ href, text }) {
      const label = escapeHtml(text || href || gettext("image"));
      return `<a href="${escapeAttr(href || "")}" class="md-image-link" title="${escapeAttr(gettext("image (not loaded)"))}">🖼 ${label}</a>`;
    },
  },
});

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

// Nothing in an answer may load a resource: no media, frames or forms even if markup got through.
const SANITIZE = {
  RETURN_DOM_FRAGMENT: true,
  FORBID_TAGS: ["img", "picture", "source", "video", "audio", "iframe", "object", "embed", "form", "input", "style", "link", "svg", "math"],
  FORBID_ATTR: ["style", "srcset", "background", "poster"],
};

/** Sanitized Markdown as a DocumentFragment. */
export function renderMarkdown(text) {
  return DOMPurify.sanitize(markdown.parse(text), SANITIZE);
}

/**
 * Render `text` (Markdown with optional <think> blocks) into `container`.
 * `charTokens[i]` is the step index that produced character i (or -1); when given, each
 * token's characters are wrapped in <span class="tok" data-step="i">.
 * `openReasoning`: which reasoning blocks start expanded (by order), kept across re-renders.
 * `segments`: [{kind: "reasoning"|"answer", start, end, is_open}] over `text` (tags excluded),
 * as the server computed them; none means the whole text is answer.
 * `notes[n]`: a line beside reasoning block n's title (how many tokens it took), if any.
 */
export function renderAnswer(container, text, charTokens = null, openReasoning = new Set(), segments = null, notes = []) {
  const parts = [];
  const segs = segments?.length ? segments : [{ kind: "answer", start: 0, end: text.length }];
  segs.forEach((seg, n) => {
    const source = text.slice(seg.start, seg.end);
    const body = document.createElement("div");
    body.className = "md";
    body.append(renderMarkdown(source));
    if (charTokens) annotateTokens(body, source, charTokens.slice(seg.start, seg.end));
    if (seg.kind === "answer") { parts.push(...body.childNodes); return; }
    const details = document.createElement("details");
    details.className = "reasoning";
    details.open = seg.is_open || openReasoning.has(n);
    details.addEventListener("toggle", () => (details.open ? openReasoning.add(n) : openReasoning.delete(n)));
    const summary = document.createElement("summary");
    summary.textContent = seg.is_open ? gettext("Reasoning…") : gettext("Reasoning");
    if (notes[n]) {
      const note = document.createElement("span");
      note.className = "reasoning-note";
      note.textContent = notes[n];
      summary.append(" ", note);
    }
    details.append(summary, body);
    parts.push(details);
  });
  container.replaceChildren(...parts);
  container.classList.add("md");
}

// Whitespace-only text nodes directly inside these are source formatting, not answer text.
const BLOCK_PARENTS = new Set(["UL", "OL", "TABLE", "THEAD", "TBODY", "TR", "BLOCKQUOTE", "DIV", "DETAILS"]);
const LOOKAHEAD = 256;

/**
 * Wrap rendered text in per-token spans. The rendered text is (nearly) a subsequence of the
 * Markdown source, so each rendered character is matched greedily to the next equal source
 * character; characters Markdown invented (none in practice) stay unwrapped.
 */
export function annotateTokens(root, source, charTokens) {
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  let src = 0;
  for (const node of nodes) {
    const text = node.data;
    if (!text.trim() && BLOCK_PARENTS.has(node.parentNode.nodeName)) continue;
    const owners = [];  // per UTF-16 unit, like `source` and `charTokens`
    for (const ch of text.split("")) {
      let k = src;
      const limit = Math.min(source.length, src + LOOKAHEAD);
      while (k < limit && source[k] !== ch) k++;
      if (k < limit) { owners.push(charTokens[k] ?? -1); src = k + 1; } else owners.push(-1);
    }
    node.replaceWith(wrapRuns(text, owners));
  }
}

function wrapRuns(text, owners) {
  const fragment = document.createDocumentFragment();
  let start = 0;
  for (let i = 1; i <= text.length; i++) {
    if (i < text.length && owners[i] === owners[start]) continue;
    const run = text.slice(start, i);
    if (owners[start] >= 0) {
      const span = document.createElement("span");
      span.className = "tok";
      span.dataset.step = owners[start];
      span.textContent = run;
      fragment.append(span);
    } else {
      fragment.append(run);
    }
    start = i;
  }
  return fragment;
}

/** Map each character (UTF-16 unit) of the concatenated text deltas to its step index. */
export function charTokensFromSteps(steps) {
  const owners = [];
  for (const step of steps) {
    for (let i = 0; i < step.text_delta.length; i++) owners.push(step.index);
  }
  return owners;
}
