// Lesson section 7, constrained decoding: one question answered twice by greedy decoding, free
// and under a small JSON schema (the request's `grammar`, docs/structured-outputs.md), and per
// step of the constrained answer the mass of the model's distribution the grammar removed
// (`masked_prob`), with the removed tokens of the step picked. Owns: that experiment and its
// per-step strip. Requests go through LessonRunner.
import { $, h } from "./dom.js";
import { explorerUrl } from "./explorer_url.js";
import { fmtProb, tokenLabel } from "./format.js";
import { GrammarError, fmtMass, grammarSpec, maskView } from "./grammar.js";
import { gettext, interpolate } from "./i18n.js";
import { measure, numbers, progress, runSection, shownText } from "./learn_view.js";

const MAX_NEW_TOKENS = 64;
const NUM_ALTERNATIVES = 10;
const OVERRULED = 0.5;  // a step where the grammar removed more than this: it chose, not the model

export function setupConstrained(runner) {
  const section = $("#learn-constrained");
  const result = $("#lc-result");
  const link = () => explorerUrl({ text: $("#lc-question").value, chat: true, temperature: 0, run: MAX_NEW_TOKENS,
    grammar_kind: "json_schema", grammar: $("#lc-schema").value });
  $("#lc-link").href = link();
  for (const id of ["#lc-question", "#lc-schema"]) $(id).addEventListener("input", () => { $("#lc-link").href = link(); });

  $("#lc-run").addEventListener("click", () => runSection(section, result, async () => {
    const text = $("#lc-question").value;
    let grammar;
    try {
      grammar = grammarSpec("json_schema", $("#lc-schema").value);
    } catch (err) {
      if (err instanceof GrammarError) throw Object.assign(new Error(err.message), { code: "invalid_params" });
      throw err;
    }
    result.replaceChildren(progress());
    const overrides = { greedy: true, repetition_penalty: 1.0, max_new_tokens: MAX_NEW_TOKENS, num_alternatives: NUM_ALTERNATIVES };
    const [free, constrained] = await Promise.all([
      runner.complete({ text, chat: true, overrides }),
      runner.complete({ text, chat: true, overrides: { ...overrides, grammar } }),
    ]);
    result.replaceChildren(...report(free, constrained));
  }));
}

function report(free, constrained) {
  const steps = constrained.steps;
  const masses = steps.map((s) => s.masked_prob ?? 0);
  const mean = masses.length ? masses.reduce((a, b) => a + b, 0) / masses.length : 0;
  const max = masses.length ? Math.max(...masses) : 0;
  const overruled = masses.filter((m) => m > OVERRULED).length;
  const parsed = parses(constrained.text);
  const detail = h("div", { class: "lc-detail" });
  const strip = h("div", { class: "mask-steps", id: "lc-steps", role: "list" });
  const select = (index) => {
    for (const [i, el] of [...strip.children].entries()) el.classList.toggle("selected", i === index);
    const step = steps[index];
    detail.replaceChildren(h("p", { class: "learn-sub" }, interpolate(gettext("Step %(step)s: “%(piece)s”"),
      { step: index, piece: tokenLabel(step.piece, step.token_bytes) })), maskView(step));
  };
  strip.append(...steps.map((step, i) => h("button", { type: "button", role: "listitem", class: "mask-step",
    dataset: { index: i, maskedProb: step.masked_prob ?? 0 },
    title: interpolate(gettext("step %(step)s · the grammar removed %(p)s"), { step: i, p: fmtMass(step.masked_prob ?? 0) }),
    onclick: () => select(i) },
  h("span", { class: "mask-col" }, h("span", { style: `height: ${((step.masked_prob ?? 0) * 100).toFixed(1)}%` })),
  h("span", { class: "piece" }, tokenLabel(step.piece, step.token_bytes)))));
  const worst = masses.indexOf(max);
  if (steps.length) select(worst);
  return [
    h("div", { class: "learn-columns" },
      answerBox("free", gettext("Free (no grammar)"), free),
      answerBox("constrained", gettext("Under the JSON schema"), constrained)),
    numbers([
      measure("num_steps", gettext("steps under the grammar"), String(steps.length), steps.length),
      measure("mean_masked_prob", gettext("mean mass removed per step"), fmtProb(mean), mean),
      measure("max_masked_prob", gettext("most removed at one step"), fmtMass(max), max),
      measure("overruled_steps", interpolate(gettext("steps where it removed more than %(p)s"), { p: fmtProb(OVERRULED) }),
        String(overruled), overruled),
      measure("valid_json", gettext("the constrained answer parses as JSON"), parsed ? gettext("yes") : gettext("no"), parsed ? 1 : 0,
        constrained.finish_reason === "length" ? gettext("it ran out of tokens before the grammar was complete") : undefined),
    ]),
    h("p", { class: "learn-sub" }, gettext("Mass the grammar removed at each step (red; blue: what it allowed). Click a step to see which tokens it removed.")),
    strip,
    detail,
  ];
}

function answerBox(kind, title, run) {
  const isJson = parses(run.text);
  const { text, cut } = shownText(run);  // a character its end cut is left out, as on the other sections
  return h("div", { class: "learn-column", dataset: { kind, json: isJson } },
    h("p", { class: "learn-sub" }, title, " ", h("span", { class: `badge${isJson ? "" : " muted"}` }, isJson ? gettext("valid JSON") : gettext("not JSON"))),
    h("p", { class: "learn-answer mono", dataset: { generationId: run.generation_id } }, text || "∅", cut));
}

function parses(text) {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}
