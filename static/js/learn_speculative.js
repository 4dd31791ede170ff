// Lesson section 4, speculative decoding (an extension of the Prefill vs Decode chapter): the same
// greedy code edit without speculation, then with `prompt_lookup`, one run after the other so they
// do not share the machine; whether the two answers are the same tokens, both decode times and
// rates, tokens per forward pass, the acceptance rate, the engine's estimated speedup, and the
// passes as a strip (speculation.js). Owns: that comparison.
import { $, h } from "./dom.js";
import { explorerUrl } from "./explorer_url.js";
import { fmtMs, fmtNum, fmtProb } from "./format.js";
import { gettext, interpolate } from "./i18n.js";
import { measure, numbers, progress, runSection, shownText } from "./learn_view.js";
import { passStrip, speculationLegend, speculationSummary } from "./speculation.js";

export function setupSpeculative(runner) {
  const section = $("#learn-speculative");
  const result = $("#lsd-result");

  $("#lsd-run").addEventListener("click", () => runSection(section, result, async () => {
    const text = $("#lsd-text").value;
    const numTokens = Number($("#lsd-tokens").value);
    const status = progress(gettext("Without speculation: one forward pass per token…"));
    result.replaceChildren(status);
    // Greedy, the prompt computed in full both times (no prefix cache): only the decode differs.
    const overrides = { greedy: true, max_new_tokens: numTokens, use_prefix_cache: false, num_alternatives: 1 };
    const plain = await runner.complete({ text, chat: true, overrides: { ...overrides, speculative: "off" } });
    status.textContent = gettext("With prompt lookup: proposals verified several at a time…");
    const spec = await runner.complete({ text, chat: true, overrides: { ...overrides, speculative: "prompt_lookup" } });
    status.replaceWith(...comparison(plain, spec));
    $("#lsd-link").href = explorerUrl({ text, chat: true, temperature: 0, run: Math.min(numTokens, 64), speculative: "prompt_lookup" });
  }));
}

/** The index of the first token where the two runs differ, or null when they are the same tokens. */
function firstDifference(a, b) {
  const n = Math.max(a.steps.length, b.steps.length);
  for (let i = 0; i < n; i += 1) if (a.steps[i]?.token_id !== b.steps[i]?.token_id) return i;
  return a.text === b.text ? null : n;
}

function comparison(plain, spec) {
  const differsAt = firstDifference(plain, spec);
  const isSame = differsAt === null;
  const summary = speculationSummary(spec.steps, spec.stats);
  const plainMs = plain.stats?.decode_ms ?? null;
  const specMs = spec.stats?.decode_ms ?? null;
  const measured = plainMs && specMs ? plainMs / specMs : null;
  const same = h("p", { class: "learn-same", dataset: { same: isSame } }, isSame
    ? interpolate(gettext("✓ The same answer, token for token: %(n)s tokens, identical with and without speculation."), { n: spec.steps.length })
    : interpolate(gettext("✗ The answers differ from token %(i)s: this should not happen (speculation must keep the model's own tokens)."), { i: differsAt }));
  const texts = h("div", { class: "learn-pair" },
    answerBox(gettext("Without speculation"), plain),
    answerBox(gettext("With prompt lookup"), spec));
  const rate = (run) => run.stats?.decode_tok_s ?? null;
  const facts = numbers([
    measure("same_text", gettext("identical answers"), isSame ? gettext("yes") : gettext("no"), isSame ? 1 : 0),
    measure("num_tokens", gettext("tokens in each answer"), String(spec.steps.length), spec.steps.length),
    measure("plain_decode_ms", gettext("decode time, without"), fmtMs(plainMs), plainMs),
    measure("spec_decode_ms", gettext("decode time, with prompt lookup"), fmtMs(specMs), specMs),
    measure("plain_tok_s", gettext("tokens/s, without"), fmtNum(rate(plain), 1), rate(plain)),
    measure("spec_tok_s", gettext("tokens/s, with prompt lookup"), fmtNum(rate(spec), 1), rate(spec)),
    measure("tokens_per_pass", gettext("tokens per decode pass"), fmtNum(summary.tokensPerPass, 2), summary.tokensPerPass),
    measure("acceptance_rate", gettext("acceptance rate"),
      summary.acceptanceRate === null ? "–" : `${fmtProb(summary.acceptanceRate)} (${summary.numAccepted}/${summary.numProposed})`,
      summary.acceptanceRate),
    measure("num_accepted_tokens", gettext("proposed tokens accepted"), String(summary.numAccepted), summary.numAccepted),
    measure("measured_speedup", gettext("decode time, without ÷ with"), measured === null ? "–" : `${measured.toFixed(2)}×`, measured),
    measure("estimated_speedup", gettext("the engine's estimate"), summary.speedup === null ? "–" : `${fmtNum(summary.speedup, 2)}×`, summary.speedup,
      gettext("what the decode's tokens would have cost as plain steps, by the measured step cost, over what they did (stats.speculative_speedup)")),
  ]);
  const verdict = h("p", { class: "learn-verdict" }, verdictText(summary, measured));
  return [same, texts, facts, verdict,
    h("p", { class: "learn-sub" }, gettext("The decode's forward passes, with prompt lookup")),
    h("p", { class: "muted small" }, gettext("One box per forward pass: the proposed tokens the model accepted, then its own token; where it rejected a proposal, that proposal is struck through. A box with one grey token had nothing to verify (nothing matched, or proposing would have cost more than it saves).")),
    speculationLegend(),
    passStrip(spec.steps)];
}

function answerBox(title, run) {
  const { text, cut } = shownText(run);
  return h("div", {}, h("p", { class: "learn-sub" }, title),
    h("p", { class: "learn-answer mono", dataset: { generationId: run.generation_id } }, text || "∅", cut));
}

function verdictText(summary, measured) {
  const passes = interpolate(gettext("Without speculation the decode took one forward pass per token; with prompt lookup it took %(passes)s passes for %(tokens)s tokens (%(per)s per pass), and the model accepted %(accepted)s of the %(proposed)s tokens proposed."),
    { passes: summary.numPasses, tokens: summary.numDecodeTokens, per: fmtNum(summary.tokensPerPass, 2), accepted: summary.numAccepted, proposed: summary.numProposed });
  if (measured === null) return passes;
  const time = measured >= 1.05 ? interpolate(gettext("Its decode was %(x)s× as fast, measured."), { x: measured.toFixed(2) })
    : measured <= 0.95 ? interpolate(gettext("This time its decode was slower (%(x)s× the speed, measured): the proposals did not pay for the extra rows."), { x: measured.toFixed(2) })
      : gettext("Its decode took about as long, measured.");
  return `${passes} ${time}`;
}
