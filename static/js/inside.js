// "Inside this step" in the explorer: the sampler stage by stage, what-if resampling, the
// layers (logit lens, embedding, attention), the KV cache, the roofline (roofline.js) and (for a
// mixture-of-experts model) the experts chosen (moe_view.js), of the last finished request, each
// computed exactly by a worker (POST /api/generations/<id>/inspect/, docs/inside.md).
// Owns: the requests, the cache of the exact processed distribution per (step, settings)
// and drawing the views. Must not know: the socket, the explorer's other panels.
import { api } from "./api.js";
import { h } from "./dom.js";
import { errorText, fmtBytes, fmtNum, fmtProb, visiblePiece } from "./format.js";
import { MOE_EXPLAIN, renderMoe } from "./moe_view.js";
import { EXPLAIN as PRECISION_EXPLAIN, defaultOther, renderPrecision } from "./precision_view.js";
import { EXPLAIN as ROOFLINE_EXPLAIN, renderRoofline } from "./roofline.js";
import { gettext, interpolate } from "./i18n.js";

const EXPLAIN = {
  waterfall: gettext("The sampler turns the model's scores into the distribution a token is drawn from, one stage at a time "
    + "(repetition penalty → temperature → top-k → top-p → min-p). Each row is the distribution after one stage: how many "
    + "tokens are still allowed, how much probability the removed ones held, and where the chosen token is."),
  whatif: gettext("The same model scores, other sampling settings: every step is drawn again with these settings and seed until "
    + "the first token that differs. That token is exactly what a real run with these settings would have written; from "
    + "there the model would read other text, so “Continue from here” runs it for real."),
  lens: gettext("A token's embedding is a vector of numbers the model looks up for it. After every transformer layer, the "
    + "logit lens applies the model's final norm and output head to the hidden state, as the model does after its last "
    + "layer: you see the prediction form layer by layer. Attention shows which earlier tokens each head of a layer reads."),
  kv: gettext("During prefill and decode the model keeps every token's keys and values (the KV cache) so it never recomputes "
    + "them. Its size follows from the model's shapes."),
  moe: MOE_EXPLAIN,
  roofline: ROOFLINE_EXPLAIN,
  precision: PRECISION_EXPLAIN,
};

export function createInside({ root, getTarget, onBranch, onExact }) {
  const exact = new Map();  // "gen:step:settings" -> Map(token_id -> prob): the waterfall's last stage
  let view = null;
  let pending = 0;
  let servedPrecision = null;

  async function inspect(kind, extra = {}) {
    const target = getTarget();
    if (!target) return null;
    const body = { view: kind, step: target.step, params: target.params, top_n: 20, ...extra };
    return api("POST", `/api/generations/${target.generationId}/inspect/`, body);
  }

  async function show(kind, extra = {}) {
    view = kind;
    for (const btn of root.querySelectorAll("[data-inside]")) btn.classList.toggle("active", btn.dataset.inside === kind);
    const out = root.querySelector("#inside-out");
    const target = getTarget();
    if (!target) { out.replaceChildren(h("p", { class: "empty" }, gettext("Finish a request first: the worker inspects finished generations."))); return; }
    const ticket = ++pending;
    out.replaceChildren(h("p", { class: "muted small" }, gettext("Asking a worker…")));
    try {
      const result = await inspect(kind, extra);
      if (ticket !== pending) return;
      out.replaceChildren(h("p", { class: "muted small explain" }, EXPLAIN[kind]), RENDER[kind](result, target));
      if (kind === "waterfall") remember(target, result);
    } catch (err) {
      if (ticket === pending) out.replaceChildren(h("p", { class: "alert" }, errorText(err)));
    }
  }

  function remember(target, result) {
    const last = result.stages[result.stages.length - 1];
    if (result.is_greedy) {  // greedy draws nothing: all of the probability on the top token (sampling.js asDrawn)
      exact.set(key(target), Object.assign(new Map([[result.final_token_id, 1]]), { below: 0 }));
      onExact?.();
      return;
    }
    // Only the top tokens come back: a token not among them has less than the smallest (0 if
    // every kept token came back, i.e. it was filtered).
    const probs = new Map(last.top.map((t) => [t.token_id, t.prob]));
    probs.below = last.top.length >= last.num_kept ? 0 : last.top[last.top.length - 1].prob;
    exact.set(key(target), probs);
    onExact?.();
  }

  const key = (t) => `${t.generationId}:${t.step}:${JSON.stringify(t.params)}`;

  /** The exact processed probabilities of the target step under the current settings, or null. */
  function exactFor() {
    const target = getTarget();
    return target ? exact.get(key(target)) ?? null : null;
  }

  /** Fetches the exact processed distribution for the preview (quietly; once per step and settings). */
  async function refreshExact() {
    const target = getTarget();
    if (!target || exact.has(key(target))) return;
    try { remember(target, await inspect("waterfall", { top_n: 50 })); } catch { /* the preview stays marked approximate */ }
  }

  const RENDER = {
    waterfall: renderWaterfall,
    whatif: (r, target) => renderWhatIf(r, target, onBranch),
    lens: (r) => renderLens(r, (layer) => show("lens", { layer })),
    kv: renderKv,
    moe: renderMoe,
    roofline: renderRoofline,
    precision: (r, target) => renderPrecision(r, target, (precision) => show("precision", { precision })),
  };
  const FIRST_ASK = { lens: () => ({ layer: 0 }), precision: () => ({ precision: defaultOther(servedPrecision) }) };

  for (const btn of root.querySelectorAll("[data-inside]")) {
    btn.addEventListener("click", () => show(btn.dataset.inside, FIRST_ASK[btn.dataset.inside]?.() ?? {}));
  }
  /** Offers the MoE view only for a model with routers (`model.num_moe_layers`, from generation.started). */
  function setModel(model) {
    root.querySelector('[data-inside="moe"]').hidden = !(model?.num_moe_layers > 0);
    servedPrecision = model?.precision ?? servedPrecision;
  }

  return { show, exactFor, refreshExact, setModel, get view() { return view; } };
}

const piece = (p) => h("span", { class: "piece" }, visiblePiece(p ?? ""));
const STAGE_LABEL = { raw: gettext("model (raw)"), repetition_penalty: gettext("repetition penalty"), temperature: gettext("temperature"),
  top_k: "top-k", top_p: "top-p", min_p: "min-p" };

/** Top-k keeps every token scoring at least the k-th score: ties (common with bfloat16 logits,
 * whose 8-bit mantissa rounds close scores together) can keep more than k. */
function tiesNote(stage) {
  return stage.name === "top_k" && stage.num_kept > stage.setting
    ? interpolate(gettext("%(n)s more than k: they tie with the k-th score, and top-k keeps ties"), { n: stage.num_kept - stage.setting }) : "";
}

/** A stage's setting as the sliders write it: "top-k 10", "temperature 0.7", "top-p 0.95". */
function stageSetting(stage) {
  return stage.name === "top_k" ? String(Math.round(stage.setting)) : String(Number(stage.setting.toFixed(4)));
}

function renderWaterfall(r) {
  const rows = r.stages.map((s) => {
    const sampled = s.sampled ? (s.sampled.is_kept ? interpolate(gettext("%(p)s · rank %(rank)s"), { p: fmtProb(s.sampled.prob), rank: s.sampled.rank })
      : gettext("removed")) : "";
    const removed = s.name === "raw" ? "" : s.num_removed
      ? interpolate(gettext("−%(n)s tokens · %(p)s of the mass"), { n: s.num_removed, p: fmtProb(s.removed_mass) }) : gettext("nothing removed");
    return h("tr", { dataset: { stage: s.name } },
      h("td", {}, STAGE_LABEL[s.name] ?? s.name, s.setting === null ? "" : ` ${stageSetting(s)}`),
      h("td", { class: "num", title: tiesNote(s) }, s.num_kept.toLocaleString(), tiesNote(s) ? " *" : ""),
      h("td", { class: "small" }, removed),
      h("td", { class: "num" }, fmtNum(s.entropy)),
      h("td", { class: "num", dataset: { sampledProb: s.sampled?.prob ?? "" } }, sampled),
      h("td", { class: "small" }, ...s.top.slice(0, 5).flatMap((t) => [piece(t.piece), ` ${fmtProb(t.prob)} `])));
  });
  const head = h("tr", {}, ...[gettext("stage"), gettext("tokens left"), gettext("removed here"), gettext("entropy (nats)"),
    interpolate(gettext("chosen “%(piece)s”"), { piece: visiblePiece(r.sampled_piece) }), gettext("top tokens after it")]
    .map((t) => h("th", {}, t)));
  const note = r.is_greedy ? h("p", { class: "small" }, gettext("Temperature 0 is greedy: only the repetition penalty applies, then the highest score wins.")) : null;
  const ties = r.stages.map(tiesNote).find(Boolean);
  return h("div", { class: "inside-view", id: "inside-waterfall" }, note, h("table", { class: "inside-table" }, h("thead", {}, head), h("tbody", {}, ...rows)),
    ties ? h("p", { class: "small", id: "waterfall-ties" }, `* ${ties}.`) : null);
}

function renderWhatIf(r, target, onBranch) {
  const d = r.diverged_at;
  const summary = d === null
    ? interpolate(gettext("Seed %(seed)s: these settings draw the same %(n)s tokens."), { seed: r.seed, n: r.num_steps })
    : interpolate(d === 0
      ? gettext("Seed %(seed)s: the very first token differs; at step %(step)s these settings draw “%(piece)s” instead of “%(original)s”.")
      : gettext("Seed %(seed)s: same tokens up to step %(last)s; at step %(step)s these settings draw “%(piece)s” instead of “%(original)s”."),
    { seed: r.seed, last: d - 1, step: d, piece: visiblePiece(r.steps[d].piece), original: visiblePiece(r.steps[d].original_piece) });
  const rows = r.steps.map((s) => h("tr", { class: s.token_id !== s.original_token_id ? "diverged" : "", dataset: { step: s.index, tokenId: s.token_id } },
    h("td", { class: "num" }, s.index), h("td", {}, piece(s.original_piece)),
    h("td", { class: "num" }, fmtProb(s.original_prob)), h("td", {}, piece(s.piece)), h("td", { class: "num" }, fmtProb(s.prob)),
    h("td", { class: "num" }, s.num_kept.toLocaleString())));
  const head = h("tr", {}, ...[gettext("step"), gettext("generated"), gettext("its p now"), gettext("drawn now"), "p", gettext("tokens left")]
    .map((t) => h("th", {}, t)));
  const strip = h("div", { class: "prob-strip", title: gettext("probability these settings give each generated token (no draw needed)") },
    ...r.original_probs.map((p, i) => h("span", { class: p === 0 ? "zero" : "", style: `--p: ${Math.min(p ?? 0, 1).toFixed(3)}`, title: interpolate(gettext("step %(step)s: %(p)s"), { step: i, p: fmtProb(p ?? 0) }) })));
  const filtered = r.first_filtered_at === null ? null
    : h("p", { class: "small" }, interpolate(gettext("These settings could never have produced the generation: step %(step)s's token is filtered out."),
      { step: r.first_filtered_at }));
  const cont = d === null ? null : h("button", { type: "button", class: "btn small", id: "whatif-continue",
    onclick: () => onBranch(d, { token_id: r.steps[d].token_id, piece: r.steps[d].piece, logprob: r.steps[d].raw_logprob }) },
  gettext("Continue from here"));
  return h("div", { class: "inside-view", id: "inside-whatif" }, h("p", { id: "whatif-summary" }, summary), cont, filtered,
    h("p", { class: "chart-title" }, gettext("p of each generated token under these settings")), strip,
    h("table", { class: "inside-table" }, h("thead", {}, head), h("tbody", {}, ...rows)));
}

function renderLens(r, chooseLayer) {
  const e = r.embedding;
  const embedding = h("div", { class: "small", id: "lens-embedding" },
    h("p", {}, gettext("Token"), " ", piece(r.piece), " ", interpolate(gettext("(id %(id)s) is a vector of %(size)s numbers, norm %(norm)s (average over the table %(mean)s). Closest tokens by direction (cosine):"),
      { id: r.token_id, size: e.size, norm: fmtNum(e.norm), mean: fmtNum(e.mean_norm) }), " "),
    h("p", {}, ...e.nearest.flatMap((n) => [piece(n.piece), ` ${fmtNum(n.cosine)}  `])));
  const rows = r.lens.map((row) => h("tr", { dataset: { layer: row.layer } },
    h("td", {}, row.layer === 0 ? gettext("embedding") : interpolate(gettext("after layer %(layer)s"), { layer: row.layer })),
    h("td", { class: "num" }, fmtNum(row.entropy)),
    h("td", {}, ...row.top.slice(0, 3).flatMap((t) => [piece(t.piece), ` ${fmtProb(t.prob)}  `]))));
  const lens = h("table", { class: "inside-table", id: "lens-table" },
    h("thead", {}, h("tr", {}, h("th", {}, gettext("hidden state")), h("th", {}, gettext("entropy")), h("th", {}, gettext("top predictions")))),
    h("tbody", {}, ...rows));
  const att = r.attention;
  const select = h("select", { class: "select small inline", id: "lens-layer", onchange: (ev) => chooseLayer(Number(ev.target.value)) },
    ...Array.from({ length: r.num_layers }, (_, i) => h("option", { value: i, selected: i === att.layer }, interpolate(gettext("layer %(layer)s"), { layer: i + 1 }))));
  const grid = h("table", { class: "attention-grid", id: "attention-grid" },
    h("thead", {}, h("tr", {}, h("th", {}, gettext("head")), ...r.context.map((c) => h("th", { class: "tok" }, visiblePiece(c.piece))))),
    h("tbody", {}, ...att.weights.map((row, head) => h("tr", {}, h("th", {}, head + 1),
      ...row.map((w, j) => h("td", { style: `--w: ${w.toFixed(3)}`, title: interpolate(gettext("head %(head)s → “%(piece)s”: %(p)s"), { head: head + 1, piece: r.context[j].piece, p: fmtProb(w) }) }))))));
  return h("div", { class: "inside-view", id: "inside-lens" }, embedding, lens,
    h("p", { class: "chart-title" }, gettext("Attention of"), " ", piece(r.piece), " ", gettext("in"), " ", select), h("div", { class: "attention-scroll" }, grid));
}

function renderKv(r) {
  const s = r.shape;
  const q = r.request;
  return h("div", { class: "inside-view small", id: "inside-kv" },
    h("p", {}, interpolate(gettext("Per token and layer: %(formula)s = %(bytes)s; × %(layers)s layers ="),
      { formula: s.formula, bytes: fmtBytes(s.bytes_per_token_per_layer), layers: s.num_layers }), " ",
    h("b", { id: "kv-per-token" }, fmtBytes(s.bytes_per_token)), " ", interpolate(gettext("per token (measured on the worker: %(bytes)s, %(dtype)s)."),
      { bytes: fmtBytes(r.measured_bytes_per_token), dtype: r.dtype })),
    h("p", {}, interpolate(gettext("This request: %(n)s tokens in the cache → %(bytes)s per layer,"), { n: q.num_tokens, bytes: fmtBytes(q.bytes_per_layer) }), " ",
      h("b", { id: "kv-total" }, fmtBytes(q.total_bytes)), " ", gettext("in total.")),
    h("p", {}, q.num_cached_tokens ? interpolate(gettext("The first %(n)s tokens (%(bytes)s) came from the prefix cache: an earlier request had computed them."),
      { n: q.num_cached_tokens, bytes: fmtBytes(q.cached_bytes) }) : gettext("Nothing came from the prefix cache: every token was computed by this request's prefill.")),
    h("p", {}, interpolate(gettext("Without a KV cache, each decode step would recompute keys and values for the whole sequence (up to %(n)s tokens) instead of one."),
      { n: q.num_tokens })));
}
