// Lesson section 8, DeepSeek: V3's architecture card from its real config (MoE experts per
// token, MLA's latent KV Cache against the expanded one), an R1-style reasoning run with a
// thinking budget on the default model, and, when the random-weights demos are registered,
// the V3 demo's measured latent cache and expert routing and the VL demo's image tokens.
// Owns: that sequence and finding the demos (by their architecture cards, not their names).
import { getJson } from "./api.js";
import { $, h } from "./dom.js";
import { fmtBytes, fmtCount, stepTexts, visiblePiece } from "./format.js";
import { gettext, interpolate } from "./i18n.js";
import { explanation, failure, measure, numbers, progress, runSection } from "./learn_view.js";

const V3_KEY = "deepseek_v3_671b";
const CONTEXT = 4096;
const THINK_OPEN = "<think>";
// Tokens after the thinking: the forced </think> (3 tokens where the vocabulary has no such token,
// as Qwen2.5's) and the answer. 48 cut English answers of the default model after ~45 tokens.
const ANSWER_TOKENS = 64;

export function setupDeepseek(runner) {
  const section = $("#learn-deepseek");
  const result = $("#ld-result");

  $("#ld-run").addEventListener("click", () => runSection(section, result, async () => {
    result.replaceChildren(progress());
    const [card, demos] = await Promise.all([getJson(`/api/architectures/${V3_KEY}/?context=${CONTEXT}`), findDemos()]);
    const parts = [v3Card(card)];
    result.replaceChildren(...parts, progress());
    parts.push(await part(() => reasoning(runner)));
    result.replaceChildren(...parts, progress());
    parts.push(await part(() => (demos.moe ? v3Demo(runner, demos.moe) : missingDemo("demo_model"))));
    result.replaceChildren(...parts, progress());
    parts.push(await part(() => (demos.vision ? vlDemo(runner, demos.vision) : missingDemo("demo_vl_model"))));
    result.replaceChildren(...parts);
  }));
}

/** One part's view, or its failure (the other parts still run). */
async function part(build) {
  try {
    return await build();
  } catch (err) {
    return failure(err);
  }
}

/** The registered models whose cards show a MoE + MLA model and a vision model. */
async function findDemos() {
  const { models } = await getJson("/api/architectures/");
  const cards = await Promise.all(models.map((m) => getJson(`/api/models/${m.id}/architecture/?context=${CONTEXT}`).catch(() => null)));
  const found = {};
  for (const card of cards.filter(Boolean)) {
    if (!found.moe && card.shape?.is_mla && card.shape?.experts) found.moe = card;
    if (!found.vision && card.vision) found.vision = card;
  }
  return found;
}

function block(kind, title, ...children) {
  return h("div", { class: "learn-part", dataset: { part: kind } }, h("p", { class: "learn-sub" }, title), ...children);
}

function v3Card(card) {
  const kv = card.kv_cache;
  const s = card.shape;
  return block("v3", interpolate(gettext("DeepSeek-V3, from its real config (%(name)s)"), { name: card.name }),
    numbers([
      measure("v3_total_params", gettext("parameters"), fmtCount(card.parameters.total), card.parameters.total),
      measure("v3_active_params", gettext("used per token"), fmtCount(card.parameters.active), card.parameters.active),
      measure("v3_experts", gettext("experts per token"), interpolate(gettext("%(k)s of %(n)s + %(shared)s shared"),
        { k: s.experts_per_token, n: s.experts, shared: s.shared_experts }), s.experts_per_token),
      measure("v3_kv_latent", gettext("KV Cache per token, MLA latent"), fmtBytes(kv.bytes_per_token), kv.bytes_per_token),
      measure("v3_kv_expanded", gettext("as full K and V per head"), fmtBytes(kv.expanded_bytes_per_token), kv.expanded_bytes_per_token),
      measure("v3_kv_context", interpolate(gettext("KV Cache at %(n)s tokens"), { n: kv.context.toLocaleString() }),
        `${fmtBytes(kv.bytes_at_context)} / ${fmtBytes(kv.expanded_bytes_at_context)}`, kv.bytes_at_context),
    ]),
    h("p", { class: "learn-verdict" }, interpolate(gettext("Each token runs %(active)s of %(total)s parameters (%(share)s), and MLA keeps %(ratio)s× fewer bytes per token than full keys and values would."),
      { active: fmtCount(card.parameters.active), total: fmtCount(card.parameters.total),
        share: `${((card.parameters.active / card.parameters.total) * 100).toFixed(1)}%`,
        ratio: (kv.expanded_bytes_per_token / kv.bytes_per_token).toFixed(0) })));
}

/** The default model as R1 runs: the chat prompt ending in <think>, with a thinking budget. */
async function reasoning(runner) {
  const question = $("#ld-question").value;
  const budget = Number($("#ld-budget").value);
  // The model's own template renders the question (one token: only the prompt is wanted).
  const rendered = await runner.complete({ text: question, chat: true, overrides: { greedy: true, max_new_tokens: 1 } });
  const text = rendered.prompt.text;
  const prompt = text.trimEnd().endsWith(THINK_OPEN) ? text : `${text}${THINK_OPEN}\n`;
  const run = await runner.complete({ text: prompt, overrides: { greedy: true, max_new_tokens: budget + ANSWER_TOKENS, max_thinking_tokens: budget } });
  const stats = run.stats;
  const numForced = run.steps.filter((s) => s.is_forced).length;
  const numAnswer = answerTokens(run.steps, stats.finish_reason).length;
  // each token's share of the text (a character over several tokens shows at its last, one the end
  // cut not at all); a token with no text of its own (a special one) shows its piece
  const { texts } = stepTexts(run.steps, stats.finish_reason);
  const piece = (s, i) => h("span", { class: s.is_forced ? "learn-forced" : s.is_reasoning ? "learn-thinking" : "learn-answer-tok",
    title: s.is_forced ? gettext("forced by the thinking budget") : undefined },
  texts[i] || (s.piece.includes("\ufffd") ? "" : visiblePiece(s.piece)));
  return block("r1", interpolate(gettext("R1's reasoning, on %(model)s with a thinking budget of %(n)s tokens"), { model: run.model.name, n: budget }),
    numbers([
      measure("num_reasoning_tokens", gettext("thinking tokens"), String(stats.num_reasoning_tokens), stats.num_reasoning_tokens),
      measure("num_forced_tokens", gettext("forced to end thinking"), String(numForced), numForced),
      measure("num_answer_tokens", gettext("answer tokens"), String(numAnswer), numAnswer),
      measure("thinking_ended_by_budget", gettext("ended by the budget"), stats.thinking_ended_by_budget ? gettext("yes") : gettext("no"),
        stats.thinking_ended_by_budget ? 1 : 0),
    ]),
    h("p", { class: "learn-trace" }, h("span", { class: "learn-tag" }, THINK_OPEN), run.steps.map(piece)),
    numAnswer ? null : h("p", { class: "learn-verdict", dataset: { noAnswer: "" } }, gettext("No answer: the model ended its turn right after the forced </think>. It was not trained to reason first, so where the budget cuts its thinking decides whether it answers; try another budget.")),
    h("p", { class: "muted small" }, gettext("Grey: thinking. Highlighted: tokens the server forced once the budget was spent. Then the answer.")));
}

/** The steps of the answer: after the thinking, neither reasoning nor forced, and not the end of
 * turn a run that ended on its own (`eos`) took last: that token writes no answer. */
function answerTokens(steps, finishReason) {
  const answer = steps.filter((s) => !s.is_reasoning && !s.is_forced);
  return finishReason === "eos" && answer.at(-1) === steps.at(-1) ? answer.slice(0, -1) : answer;
}

async function v3Demo(runner, card) {
  const run = await runner.complete({ text: gettext("The capital of France is"), model_id: card.model_id,
    overrides: { greedy: true, max_new_tokens: 4 } });
  const p = run.prefilled;
  const perToken = p.kv_cache_bytes / p.num_prompt_tokens;
  const routing = run.steps[0].moe_routing ?? [];
  return block("v3-demo", interpolate(gettext("Measured on %(model)s"), { model: card.name }),
    numbers([
      measure("demo_kv_per_token", gettext("KV Cache per token, measured"), fmtBytes(perToken), perToken),
      measure("demo_kv_card", gettext("latent, from the card"), fmtBytes(card.kv_cache.bytes_per_token), card.kv_cache.bytes_per_token),
      measure("demo_kv_expanded", gettext("expanded, from the card"), fmtBytes(card.kv_cache.expanded_bytes_per_token),
        card.kv_cache.expanded_bytes_per_token),
      measure("demo_moe_layers", gettext("MoE layers routed for the first token"), String(routing.length), routing.length),
    ]),
    h("ul", { class: "learn-routing" }, routing.map((layer) => h("li", { dataset: { layer: layer.layer } },
      interpolate(gettext("layer %(layer)s: experts %(experts)s"), { layer: layer.layer, experts: layer.experts.join(", ") })))));
}

/** A small picture drawn here (stripes), sent to the vision demo; its tokens as the engine counted them. */
async function vlDemo(runner, card) {
  const canvas = document.createElement("canvas");
  canvas.width = 96;
  canvas.height = 64;
  const context = canvas.getContext("2d");
  for (let x = 0; x < canvas.width; x += 8) {
    context.fillStyle = (x / 8) % 2 ? "#4f46e5" : "#f79009";
    context.fillRect(x, 0, 8, canvas.height);
  }
  const run = await runner.complete({ text: gettext("Describe the image."), model_id: card.model_id,
    images: [{ data: canvas.toDataURL("image/png"), media_type: "image/png" }], overrides: { greedy: true, max_new_tokens: 4 } });
  const image = run.prompt.images[0];
  return block("vl-demo", interpolate(gettext("An image through %(model)s"), { model: card.name }),
    h("div", { class: "learn-image-row" }, canvas,
      numbers([
        measure("image_tokens", gettext("image tokens"), String(image.num_tokens), image.num_tokens),
        measure("image_grid", gettext("patch grid"), `${image.grid[0]}×${image.grid[1]}`, image.grid[0] * image.grid[1]),
        measure("image_kv_bytes", gettext("its KV Cache"), fmtBytes(image.kv_bytes), image.kv_bytes),
        measure("prompt_tokens", gettext("prompt tokens in all"), String(run.prefilled.num_prompt_tokens), run.prefilled.num_prompt_tokens),
      ])),
    card.vision.vl2_tilings ? h("p", { class: "muted small" }, interpolate(gettext("DeepSeek-VL2 cuts a large image into tiles: %(list)s."),
      { list: card.vision.vl2_tilings.map((t) => interpolate(gettext("%(a)s×%(b)s tiles, %(n)s tokens"),
        { a: t.tiles[0], b: t.tiles[1], n: t.total })).join("; ") })) : null);
}

function missingDemo(command) {
  return explanation(gettext("Not registered on this server"),
    interpolate(gettext("The random-weights demo with DeepSeek's architecture is not registered here. python -m django %(command)s builds and registers it (make run does it); this part then runs on it."),
      { command }));
}
