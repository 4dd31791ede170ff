// Lesson section 1, the basic flow: the text's tokens, the model's shapes, and the ten most
// likely next tokens of one forward pass; picking one appends it and runs the next step.
// Owns: the path of picked tokens and drawing one step. Requests go through LessonRunner.
import { $, h } from "./dom.js";
import { explorerUrl } from "./explorer_url.js";
import { fmtMs, fmtProb, tokenLabel } from "./format.js";
import { gettext, interpolate } from "./i18n.js";
import { measure, numbers, progress, runSection } from "./learn_view.js";
import { pipelineStrip } from "./pipeline_strip.js";
import { tokenChips } from "./prompt_view.js";

const NUM_SHOWN = 10;

export function setupPipeline(runner) {
  const section = $("#learn-pipeline");
  const result = $("#lp-result");
  const path = [];  // [{token_id, piece}] picked after the text

  const step = () => runSection(section, result, async () => {
    result.replaceChildren(progress());
    const text = $("#lp-text").value;
    const run = await runner.complete({
      text, token_ids: path.map((p) => p.token_id),
      overrides: { greedy: true, max_new_tokens: 1, num_alternatives: NUM_SHOWN },
    });
    result.replaceChildren(...draw(run, text, path, (alt) => { path.push(alt); step(); }));
    $("#lp-link").href = explorerUrl({ text: text + path.map((p) => p.piece).join(""), chat: false });
  });

  $("#lp-run").addEventListener("click", step);
  $("#lp-reset").addEventListener("click", () => {
    path.length = 0;
    result.replaceChildren();
    $("#lp-link").href = explorerUrl({ text: $("#lp-text").value, chat: false });
  });
  $("#lp-text").addEventListener("input", () => { path.length = 0; });
}

function draw(run, text, path, onPick) {
  const model = run.model;
  const prompt = run.prompt;
  const first = run.steps[0];
  const p = run.prefilled;
  return [
    pipelineStrip({ model, params: run.params, phase: "prefill", numPromptTokens: p.num_prompt_tokens,
      numPrefilledTokens: p.num_prefilled_tokens }),
    h("p", { class: "learn-sub" }, gettext("The tokens the model read")),
    tokenChips(prompt.tokens),
    numbers([
      measure("num_prompt_tokens", gettext("tokens"), String(p.num_prompt_tokens), p.num_prompt_tokens),
      measure("hidden_size", gettext("embedding size"), String(model.hidden_size), model.hidden_size),
      measure("num_layers", gettext("transformer layers"), String(model.num_layers), model.num_layers),
      measure("vocab_size", gettext("scores (vocabulary)"), model.vocab_size.toLocaleString(), model.vocab_size),
      measure("prefill_ms", gettext("one forward pass"), fmtMs(p.prefill_ms), p.prefill_ms,
        interpolate(gettext("%(computed)s tokens computed, %(cached)s reused from the prefix cache"),
          { computed: p.num_prefilled_tokens, cached: p.num_cached_tokens })),
    ]),
    h("p", { class: "learn-sub" }, gettext("The next token: the model's ten most likely (click one to append it)")),
    h("div", { class: "learn-dist", role: "list" }, first.top_raw.slice(0, NUM_SHOWN).map((alt, i) =>
      h("button", { type: "button", role: "listitem", class: `learn-dist-row${i === 0 ? " top" : ""}`,
        dataset: { tokenId: alt.token_id, prob: alt.prob }, onclick: () => onPick({ token_id: alt.token_id, piece: alt.piece }) },
      h("span", { class: "muted" }, String(i + 1)), h("span", { class: "piece" }, tokenLabel(alt.piece)),
      h("span", { class: "learn-bar" }, h("span", { style: `width: ${(alt.prob * 100).toFixed(1)}%` })),
      h("span", { class: "num" }, fmtProb(alt.prob))))),
    h("p", { class: "learn-sub" }, gettext("The text so far")),
    h("p", { class: "learn-path" }, h("span", {}, text),
      path.map((picked) => h("span", { class: "learn-picked" }, picked.piece.includes("\ufffd") ? tokenLabel(picked.piece) : picked.piece))),
  ];
}
