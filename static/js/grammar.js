// The grammar a request carries (SamplingParams.grammar, docs/structured-outputs.md) on the
// pages: a kind and a text as a person types them (the chat's settings, the explorer), and what
// the grammar did to one step. Owns: turning kind + text into the spec the server checks (the
// server's grammar_spec.check has the last word), the kinds' examples, and the step's mask view
// (the raw mass the grammar removed, `masked_prob`, and the listed tokens it removed,
// `top_masked`). Must not know the pages' layout or the socket.
import { h } from "./dom.js";
import { fmtProb, visiblePiece } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

/** The kinds a page offers ("" = none), with the text each one takes. */
export const GRAMMAR_KINDS = ["", "json_schema", "regex", "choice"];

export function grammarExample(kind) {
  if (kind === "json_schema") {
    return '{"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"]}';
  }
  if (kind === "regex") return "[0-9]{3}-[0-9]{4}";
  if (kind === "choice") return "yes\nno\nmaybe";
  return "";
}

export class GrammarError extends Error {}

/**
 * `kind` and `text` -> the grammar spec (null for kind ""); a GrammarError says what is wrong.
 * A schema goes as its JSON text: its properties keep their order (the order the answer
 * writes them in) in any store. Choices: one per line, empty lines skipped.
 */
export function grammarSpec(kind, text) {
  if (!kind) return null;
  if (kind === "json_schema") {
    let schema;
    try {
      schema = JSON.parse(text);
    } catch (err) {
      throw new GrammarError(interpolate(gettext("The JSON schema is not JSON: %(error)s"), { error: err.message }));
    }
    if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
      throw new GrammarError(gettext("The JSON schema must be an object, e.g. {\"type\": \"object\"}."));
    }
    return { type: "json_schema", schema: text.trim() };
  }
  if (kind === "regex") {
    const pattern = text.replace(/\r?\n$/, "");
    if (!pattern) throw new GrammarError(gettext("Write a regular expression the whole answer must match."));
    return { type: "regex", pattern };
  }
  if (kind === "choice") {
    const choices = text.split(/\r?\n/).filter((line) => line !== "");
    if (!choices.length) throw new GrammarError(gettext("Write the choices, one per line."));
    return { type: "choice", choices };
  }
  throw new GrammarError(interpolate(gettext("Unknown grammar kind: %(kind)s"), { kind }));
}

/** A share of the mass: as fmtProb, but a share near 1 keeps its decimal (fmtProb's "100%" beside
 * "0.2% allowed" would not add up). */
export function fmtMass(p) {
  return p >= 0.995 && p < 1 ? `${(Math.floor(p * 1000) / 10).toFixed(1)}%` : fmtProb(p);
}

/** The share of the raw mass the grammar removed that lies outside the listed tokens. */
export function unlistedMass(step) {
  const listed = (step.top_masked ?? []).reduce((sum, alt) => sum + alt.prob, 0);
  return Math.max(0, (step.masked_prob ?? 0) - listed);
}

/**
 * What the grammar did at `step`: the raw probability it removed, the listed tokens it removed
 * (struck through, with their raw probability) and what lies beyond them. null without a grammar.
 */
export function maskView(step) {
  if (step?.masked_prob === null || step?.masked_prob === undefined) return null;
  const removed = step.top_masked ?? [];
  const rest = unlistedMass(step);
  const kept = 1 - step.masked_prob;
  return h("div", { class: "mask-view", dataset: { maskedProb: step.masked_prob } },
    h("p", { class: "mask-head" },
      h("b", {}, interpolate(gettext("The grammar removed %(p)s"), { p: fmtMass(step.masked_prob) })),
      " ", h("span", { class: "muted" }, interpolate(gettext("of the model's probability; the token was drawn from the %(p)s it allowed, renormalized."),
        { p: fmtMass(kept) }))),
    h("div", { class: "mask-bar", title: gettext("the model's raw distribution: allowed by the grammar, removed by it"), "aria-hidden": "true" },
      h("span", { class: "mask-kept", style: `width: ${(kept * 100).toFixed(1)}%` }),
      h("span", { class: "mask-removed", style: `width: ${(step.masked_prob * 100).toFixed(1)}%` })),
    removed.length ? h("ul", { class: "mask-tokens", "aria-label": gettext("removed tokens") }, removed.map((alt) =>
      h("li", { dataset: { tokenId: alt.token_id, prob: alt.prob } },
        h("s", { class: "piece" }, alternativeLabel(alt.piece)), " ", h("span", { class: "num muted" }, fmtProb(alt.prob)))))
      : h("p", { class: "muted small" }, gettext("None of the listed tokens was removed.")),
    rest > 0.0005 ? h("p", { class: "muted small mask-rest" }, interpolate(gettext("+ %(p)s on tokens beyond the listed ones"), { p: fmtProb(rest) })) : null);
}

/**
 * The grammar field of a page (templates/partials/_grammar_field.html, ids `<prefix>-grammar-kind`
 * and `<prefix>-grammar-text`): choosing a kind fills in its example while the text is empty or
 * still another kind's example; `onChange` after either changes. `.spec()` is `grammarSpec` of
 * the two (a GrammarError marks the text invalid).
 */
export function grammarField(prefix, onChange = () => {}) {
  const kind = document.getElementById(`${prefix}-grammar-kind`);
  const text = document.getElementById(`${prefix}-grammar-text`);
  const showKind = () => {
    text.hidden = !kind.value;
    if (!text.value.trim() || GRAMMAR_KINDS.some((k) => k && text.value === grammarExample(k))) text.value = grammarExample(kind.value);
    text.removeAttribute("aria-invalid");
  };
  kind.addEventListener("change", () => { showKind(); onChange(); });
  text.addEventListener("input", () => { text.removeAttribute("aria-invalid"); onChange(); });
  showKind();
  return {
    kind,
    text,
    spec() {
      try {
        return grammarSpec(kind.value, text.value);
      } catch (err) {
        text.setAttribute("aria-invalid", "true");
        throw err;
      }
    },
    set(kindValue, textValue) {
      kind.value = kindValue;
      text.value = textValue;
      showKind();
    },
  };
}

/** An alternative's piece (it has no bytes to show): a part of a multi-byte character as "<…>". */
function alternativeLabel(piece) {
  return visiblePiece(piece).replace(/\ufffd+/g, "<…>");
}
