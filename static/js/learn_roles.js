// Lesson section 5, role tagging and chat templates: one user message rendered through the
// model's own template (`complete` with `chat: true`: role markers and special tokens as the
// prompt's spans) beside the same words without any tags, and what the model writes after
// each. Owns: that comparison.
import { $, h } from "./dom.js";
import { explorerUrl } from "./explorer_url.js";
import { finishReasonLabel } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";
import { measure, numbers, progress, runSection, shownText } from "./learn_view.js";
import { promptText } from "./prompt_view.js";

export function setupRoles(runner) {
  const section = $("#learn-roles");
  const result = $("#lr-result");

  $("#lr-run").addEventListener("click", () => runSection(section, result, async () => {
    const text = $("#lr-text").value;
    const overrides = { greedy: true, max_new_tokens: Number($("#lr-tokens").value) };
    result.replaceChildren(progress());
    const [tagged, plain] = await Promise.all([
      runner.complete({ text, chat: true, overrides }),
      runner.complete({ text, chat: false, overrides }),
    ]);
    const numTagged = tagged.prompt.tokens.length;
    const numPlain = plain.prompt.tokens.length;
    result.replaceChildren(
      numbers([
        measure("tagged_prompt_tokens", gettext("tokens with the template"), String(numTagged), numTagged),
        measure("plain_prompt_tokens", gettext("tokens without tags"), String(numPlain), numPlain),
        measure("template_tokens", gettext("added by the template"), String(numTagged - numPlain), numTagged - numPlain),
      ]),
      h("div", { class: "learn-columns" },
        column("tagged", gettext("With the chat template"), gettext("What the model reads: role markers in purple, special tokens in pink."), tagged),
        column("plain", gettext("Without tags"), gettext("The same words as plain text to continue."), plain)),
      h("p", { class: "learn-verdict" }, interpolate(gettext("The lesson writes a user turn as %(lesson)s; this model's template writes %(model)s. The markers tell the model that a user asked and that its own answer starts now."),
        { lesson: "<|user|>…<|assistant|>", model: userTurn(tagged.prompt, text) })));
    $("#lr-link").href = explorerUrl({ text, chat: true, temperature: 0, run: Math.min(overrides.max_new_tokens, 64) });
  }));
}

/** How the template wraps the user's words: from the marker before them to the end ("…" for the words). */
function userTurn(prompt, message) {
  const start = prompt.text.lastIndexOf(message);
  if (start < 0) return "–";
  const marks = (prompt.spans || []).filter((s) => s.kind !== "content" && s.start < start);
  const specials = marks.filter((s) => s.kind === "special");
  const from = specials.length ? specials.at(-1).start : marks.length ? marks.at(-1).start : start;
  return `${prompt.text.slice(from, start)}…${prompt.text.slice(start + message.length)}`.replace(/\n/g, " ").trim();
}

function column(kind, title, note, run) {
  const { text, cut } = shownText(run);
  return h("div", { class: "learn-column", dataset: { kind } },
    h("p", { class: "learn-sub" }, title), h("p", { class: "muted small" }, note),
    promptText(run.prompt),
    h("p", { class: "learn-sub" }, gettext("The model's answer")),
    h("p", { class: "learn-answer", dataset: { generationId: run.generation_id } }, text || "∅", cut),
    h("p", { class: "muted small" }, interpolate(ngettext("%(n)s token · stopped by %(reason)s", "%(n)s tokens · stopped by %(reason)s",
      run.stats.num_generated_tokens), { n: run.stats.num_generated_tokens, reason: finishReasonLabel(run.finish_reason) })));
}
