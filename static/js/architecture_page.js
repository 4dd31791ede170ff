// The architecture card page: pick a registered model or a reference config (DeepSeek-V3 671B,
// V2-Lite, the R1 distills), a context length and a dtype; show what /api/architectures/ computes
// from the config. Owns: the controls, the card's tables and the KV comparison bars. No socket.
import { getJson } from "./api.js";
import { h, $, wholeNamePicker } from "./dom.js";
import { fmtSi } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

const units = ["", "K", "M", "B", "T", "P"];
function big(n, suffix = "") {
  let value = n, unit = 0;
  while (Math.abs(value) >= 1000 && unit < units.length - 1) { value /= 1000; unit += 1; }
  return `${value.toFixed(unit === 0 ? 0 : value < 10 ? 2 : 1)}${units[unit]}${suffix}`;
}
const bytes = (n) => {
  const u = ["B", "KB", "MB", "GB", "TB"];
  let value = n, unit = 0;
  while (value >= 1000 && unit < u.length - 1) { value /= 1000; unit += 1; }
  return `${value.toFixed(unit === 0 ? 0 : 1)} ${u[unit]}`;
};
const exact = (n) => Number(n).toLocaleString("en-US");
const flop = (n) => fmtSi(n, "FLOP");  // "8.48 TFLOP": a space before the unit, as in "287.8 MB"

function table(title, rows) {
  return h("div", { class: "arch-block" }, h("h2", {}, title),
    h("table", { class: "arch-table" }, h("tbody", {}, rows.filter(Boolean).map(([k, v, note]) =>
      h("tr", {}, h("th", { scope: "row" }, k), h("td", {}, v), h("td", { class: "muted small" }, note ?? ""))))));
}

function kvBars(kv) {
  const max = Math.max(kv.bytes_per_token, kv.expanded_bytes_per_token);
  const bar = (label, value, cls) => h("div", { class: "arch-bar-row" },
    h("span", { class: "arch-bar-label" }, label),
    h("span", { class: `arch-bar ${cls}`, style: `width:${Math.max(0.5, (100 * value) / max)}%` }),
    h("span", { class: "arch-bar-value" }, `${exact(value)} B/token`));
  const cached = kv.form === "mla_latent" ? gettext("MLA latent + rope key (cached)") : interpolate(gettext("%(form)s K/V (cached)"), { form: kv.form.toUpperCase() });
  const expanded = kv.form === "mla_latent" ? gettext("same model, K/V expanded per head") : gettext("as MHA (a K/V per query head)");
  return h("div", { class: "arch-bars", role: "img",
    "aria-label": interpolate(gettext("%(cached)s: %(bytes)s bytes per token; %(expanded)s: %(expanded_bytes)s"),
      { cached, bytes: kv.bytes_per_token, expanded, expanded_bytes: kv.expanded_bytes_per_token }) },
  bar(cached, kv.bytes_per_token, "cached"), bar(expanded, kv.expanded_bytes_per_token, "expanded"));
}

/** A vision-language model: its own tokens per image and DeepSeek-VL2's dynamic tiling counts. */
function visionTable(vision) {
  const own = vision.model;
  const p = vision.vl2_processor;
  return table(gettext("Images (tokens and KV cache per image)"), [
    own ? [gettext("this model"), interpolate(gettext("%(n)s tokens"), { n: exact(own.tokens_per_image) }),
      interpolate(gettext("%(size)s px in %(patch)s px patches: %(rows)s×%(cols)s, one token each · %(bytes)s of KV"),
        { size: own.image_size, patch: own.patch_size, rows: own.grid[0], cols: own.grid[1], bytes: bytes(own.kv_bytes_per_image) })] : null,
    ...vision.vl2_tilings.map((t) => [interpolate(gettext("VL2, %(a)s×%(b)s tiles"), { a: t.tiles[0], b: t.tiles[1] }),
      interpolate(gettext("%(n)s tokens"), { n: exact(t.total) }),
      interpolate(gettext("global %(global)s + separator %(separator)s + local %(local)s (%(size)s px, patch %(patch)s, downsample %(downsample)s) · %(bytes)s of KV at this model's bytes per token"),
        { global: t.global, separator: t.separator, local: exact(t.local), size: p.image_size, patch: p.patch_size, downsample: p.downsample, bytes: bytes(t.kv_bytes) })]),
  ]);
}

function render(card) {
  const s = card.shape, p = card.parameters, kv = card.kv_cache, f = card.flops, read = card.decode_bytes_read;
  const moe = s.experts > 0;
  const root = $("#arch-card");
  root.replaceChildren(...[
    h("h2", { class: "arch-name" }, card.name, h("span", { class: "muted small" }, `  ${s.model_type}`)),
    /random weights/i.test(card.name) ? h("p", { class: "random-weights-notice" },
      gettext("Random weights: this model has the real architecture but untrained, random parameters; its text is noise.")) : null,
    table(gettext("Parameters"), [
      [gettext("total"), big(p.total), exact(p.total)],
      [gettext("active per token"), big(p.active), moe ? interpolate(gettext("%(k)s of %(n)s routed experts + %(shared)s shared, in %(moe_layers)s of %(layers)s layers"),
        { k: s.experts_per_token, n: s.experts, shared: s.shared_experts, moe_layers: s.moe_layers, layers: s.layers }) : gettext("dense: every parameter, every token")],
      [gettext("attention"), big(p.attention), s.is_mla ? interpolate(gettext("MLA: q rank %(q)s, kv latent %(kv)s, rope %(rope)s"),
        { q: s.q_lora_rank || gettext("full"), kv: s.kv_lora_rank, rope: s.qk_rope_dim })
        : interpolate(gettext("%(heads)s query heads, %(kv_heads)s KV heads of %(dim)s"), { heads: s.heads, kv_heads: s.kv_heads, dim: s.head_dim })],
      moe ? [gettext("routed experts"), big(p.routed_experts), interpolate(gettext("%(n)s of them active per token"), { n: big(p.active_routed_experts) })] : null,
      moe ? [gettext("router"), big(p.router), interpolate(gettext("groups: %(groups)s, kept per token: %(kept)s; scale %(scale)s"),
        { groups: s.expert_groups, kept: s.groups_per_token, scale: s.routed_scale })] : null,
      [gettext("embedding / lm head"), `${big(p.embedding)} / ${big(p.lm_head)}`, s.tied_embeddings ? gettext("tied: one matrix") : ""],
      [gettext("weights"), bytes(card.weights.bytes), interpolate(gettext("%(dtype)s; active %(bytes)s"), { dtype: card.weights.dtype, bytes: bytes(card.weights.active_bytes) })],
    ]),
    h("div", { class: "arch-block" }, h("h2", {}, gettext("KV cache per token")), kvBars(kv)),
    table(interpolate(gettext("KV cache at %(n)s tokens"), { n: exact(kv.context) }), [
      [gettext("cached"), bytes(kv.bytes_at_context), interpolate(gettext("%(dtype)s, %(n)s values per token"), { dtype: kv.dtype, n: exact(kv.values_per_token) })],
      [gettext("expanded"), bytes(kv.expanded_bytes_at_context), interpolate(gettext("%(ratio)sx the cached form"), { ratio: (kv.expanded_bytes_per_token / kv.bytes_per_token).toFixed(1) })],
      kv.sliding_window ? [gettext("sliding window"), interpolate(gettext("%(n)s tokens"), { n: exact(kv.sliding_window) }),
        gettext("attention sees only the last tokens: the cache keeps at most this many, and a longer conversation cannot be reused from the prefix cache")] : null,
    ]),
    table(interpolate(gettext("FLOPs (context %(n)s)"), { n: exact(f.context) }), [
      [gettext("decode, one token"), flop(f.decode_per_token.as_run), s.is_mla ? gettext("as transformers runs MLA: every cached latent re-expanded each step") : ""],
      s.is_mla ? [gettext("decode, absorbed"), flop(f.decode_per_token.absorbed), gettext("kv_b folded into query and output, attention over latents (DeepSeek's inference)")] : null,
      [gettext("prefill, per token"), flop(f.prefill_per_token), interpolate(gettext("prefill of %(n)s tokens: %(flops)s (logits of the last position only, the one sampled from)"),
        { n: exact(f.context), flops: flop(f.prefill_total) })],
    ]),
    card.vision ? visionTable(card.vision) : null,
    table(gettext("Bytes read per decoded token (batch 1)"), [
      [gettext("weights"), bytes(read.weights), gettext("each weight the token touches, once")],
      [gettext("KV cache"), bytes(read.kv_cache), interpolate(gettext("all %(n)s cached positions"), { n: exact(kv.context) })],
      [gettext("total"), bytes(read.total), interpolate(gettext("at 3 TB/s of memory bandwidth: %(n)s tokens/s at most"), { n: (3e12 / read.total).toFixed(1) })],
    ]),
  ].filter(Boolean));  // replaceChildren would write an absent part as the text "null"
}

function showError(message) {
  const el = $("#arch-error");
  el.hidden = !message;
  el.textContent = message || "";
}

let latest = 0;  // the newest request: an older answer arriving late is dropped, so each change renders once

async function refresh() {
  const choice = $("#arch-model").value;
  if (!choice) return;
  const params = new URLSearchParams({ context: $("#arch-context").value || "4096" });
  if ($("#arch-dtype").value) params.set("dtype", $("#arch-dtype").value);
  const [kind, id] = choice.split(":");
  const path = kind === "model" ? `/api/models/${id}/architecture/` : `/api/architectures/${id}/`;
  const ticket = ++latest;
  const card = $("#arch-card");
  card.setAttribute("aria-busy", "true");
  try {
    const result = await getJson(`${path}?${params}`);
    if (ticket !== latest) return;
    render(result);
    showError("");
  } catch (err) {
    if (ticket !== latest) return;
    showError(err.message);
  }
  // What the card on screen shows, for anyone waiting for it to settle (the browser tests).
  card.dataset.shows = `${choice}?${params}`;
  card.removeAttribute("aria-busy");
}

async function init() {
  const conn = document.getElementById("conn");
  if (conn) conn.hidden = true;  // this page has no socket
  const { models, references } = await getJson("/api/architectures/");
  const select = $("#arch-model");
  wholeNamePicker(select);
  select.append(
    h("optgroup", { label: gettext("Registered models") }, models.map((m) => h("option", { value: `model:${m.id}` }, m.name))),
    h("optgroup", { label: gettext("Real configs (no weights)") }, references.map((r) => h("option", { value: `ref:${r.key}` }, r.name))),
  );
  const fallback = models.find((m) => m.is_default) ?? models[0];
  if (fallback) select.value = `model:${fallback.id}`;
  const wanted = new URLSearchParams(location.search).get("model");
  if (wanted && [...select.options].some((o) => o.value === wanted)) select.value = wanted;
  for (const id of ["#arch-model", "#arch-context", "#arch-dtype"]) $(id).addEventListener("change", refresh);
  $("#arch-form").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
  await refresh();
}

init().catch((err) => showError(err.message));
