// Lesson section 3, Prefill vs Decode: one request's prefill time per token against its decode
// time per token, the two placed on the roofline the worker measures of its own device
// (inspection view "roofline", docs/inside.md), then the same request disaggregated (PD) when
// prefill and decode workers run, and an explanation when they do not. Owns: that sequence.
import { api } from "./api.js";
import { $, h } from "./dom.js";
import { explorerUrl } from "./explorer_url.js";
import { fmtMs } from "./format.js";
import { gettext, interpolate } from "./i18n.js";
import { explanation, failure, measure, numbers, progress, runSection } from "./learn_view.js";
import { renderRoofline } from "./roofline.js";
import { servingView } from "./serving.js";

export function setupPhases(runner) {
  const section = $("#learn-phases");
  const result = $("#lf-result");
  const pdBox = $("#lf-pd");

  $("#lf-run").addEventListener("click", () => runSection(section, result, async () => {
    const text = $("#lf-text").value;
    const numTokens = Number($("#lf-tokens").value);
    pdBox.replaceChildren();
    result.replaceChildren(progress());
    // No prefix cache: the prefill must compute the whole prompt, every time it is run.
    const command = { text, chat: true, overrides: { greedy: true, max_new_tokens: numTokens, use_prefix_cache: false } };
    const run = await runner.complete(command);
    result.replaceChildren(phaseNumbers(run), progress(gettext("The worker places both phases on its roofline…")));
    const roofline = await api("POST", `/api/generations/${run.generation_id}/inspect/`, { view: "roofline" });
    result.lastChild.replaceWith(h("p", { class: "learn-sub" }, gettext("On this worker's roofline")), renderRoofline(roofline));
    $("#lf-link").href = explorerUrl({ text, chat: true, temperature: 0, run: Math.min(numTokens, 64), prefix_cache: false });
    pdBox.replaceChildren(progress(gettext("Now the same request with prefill and decode on two workers (PD)…")));
    pdBox.replaceChildren(...await disaggregated(runner, command));
  }));
}

function phaseNumbers(run) {
  const p = run.prefilled;
  const decode = run.steps.filter((s) => s.phase === "decode").map((s) => s.latency_ms);
  const prefillPerToken = p.prefill_ms / Math.max(1, p.num_prefilled_tokens);
  const decodePerToken = decode.reduce((sum, ms) => sum + ms, 0) / Math.max(1, decode.length);
  const ratio = decodePerToken / prefillPerToken;
  return h("div", { class: "learn-summary" },
    numbers([
      measure("num_prefilled_tokens", gettext("prompt tokens (one prefill pass)"), String(p.num_prefilled_tokens), p.num_prefilled_tokens),
      measure("prefill_ms", gettext("prefill time"), fmtMs(p.prefill_ms), p.prefill_ms),
      measure("prefill_ms_per_token", gettext("prefill, per token"), fmtMs(prefillPerToken), prefillPerToken),
      measure("num_decode_steps", gettext("decode steps"), String(decode.length), decode.length),
      measure("decode_ms_per_token", gettext("decode, per token"), fmtMs(decodePerToken), decodePerToken),
      measure("decode_over_prefill", gettext("decode ÷ prefill, per token"), `${ratio.toFixed(1)}×`, ratio),
    ]),
    h("div", { class: "learn-bars", role: "img", "aria-label": gettext("time per token") },
      bar(gettext("Prefill"), prefillPerToken, Math.max(prefillPerToken, decodePerToken), "prefill"),
      bar(gettext("Decode"), decodePerToken, Math.max(prefillPerToken, decodePerToken), "decode")),
    h("p", { class: "learn-verdict" }, interpolate(gettext("Prefill read the weights once for all %(n)s prompt tokens; each decode step read them all again for a single token. Per token, decode took %(ratio)s× as long."),
      { n: p.num_prefilled_tokens, ratio: ratio.toFixed(1) })));
}

function bar(label, ms, maxMs, phase) {
  return h("div", { class: "learn-bar-row" }, h("span", {}, label),
    h("span", { class: "learn-bar" }, h("span", { class: `learn-${phase}`, style: `width: ${((ms / maxMs) * 100).toFixed(1)}%` })),
    h("span", { class: "num" }, interpolate(gettext("%(ms)s per token"), { ms: fmtMs(ms) })));
}

/** The request again with `pd: true`: its handoff timeline, or why this server cannot show one. */
async function disaggregated(runner, command) {
  try {
    const run = await runner.complete({ ...command, pd: true });
    return [h("p", { class: "learn-sub" }, gettext("The same request, disaggregated")), ...servingView({ stats: run.stats })];
  } catch (err) {
    if (err.code !== "no_worker_for_mode") return [failure(err)];
    return [explanation(gettext("PD disaggregation is not running on this server"),
      gettext("Prefill and decode both ran on one worker above (colocated). To see the hand-over, start a prefill worker and a decode worker beside it: make worker QUEUES=prefill and make worker QUEUES=decode (docs/pd-disaggregation.md). This section then shows the timeline: prefill on one worker, the KV Cache stored and fetched, decode on the other."))];
  }
}
