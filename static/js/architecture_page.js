// The architecture card page: pick a registered model or a reference config (DeepSeek-V3 671B,
// V2-Lite, the R1 distills), a context length and a dtype; show what /api/architectures/ computes
// from the config. Owns: the controls, the card's tables and the KV comparison bars. No socket.
import { getJson } from "./api.js";
import { h, $ } from "./dom.js";
import { fmtSi } from "./format.js";

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
  const cached = kv.form === "mla_latent" ? "MLA latent + rope key (cached)" : `${kv.form.toUpperCase()} K/V (cached)`;
  const expanded = kv.form === "mla_latent" ? "same model, K/V expanded per head" : "as MHA (a K/V per query head)";
  return h("div", { class: "arch-bars", role: "img",
    "aria-label": `${cached}: ${kv.bytes_per_token} bytes per token; ${expanded}: ${kv.expanded_bytes_per_token}` },
  bar(cached, kv.bytes_per_token, "cached"), bar(expanded, kv.expanded_bytes_per_token, "expanded"));
}

/** A vision-language model: its own tokens per image and DeepSeek-VL2's dynamic tiling counts. */
function visionTable(vision) {
  const own = vision.model;
  const p = vision.vl2_processor;
  return table("Images (tokens and KV cache per image)", [
    own ? ["this model", `${exact(own.tokens_per_image)} tokens`,
      `${own.image_size} px in ${own.patch_size} px patches: ${own.grid[0]}×${own.grid[1]}, one token each · ${bytes(own.kv_bytes_per_image)} of KV`] : null,
    ...vision.vl2_tilings.map((t) => [`VL2, ${t.tiles[0]}×${t.tiles[1]} tiles`, `${exact(t.total)} tokens`,
      `global ${t.global} + separator ${t.separator} + local ${exact(t.local)} (${p.image_size} px, patch ${p.patch_size}, ` +
      `downsample ${p.downsample}) · ${bytes(t.kv_bytes)} of KV at this model's bytes per token`]),
  ]);
}

function render(card) {
  const s = card.shape, p = card.parameters, kv = card.kv_cache, f = card.flops, read = card.decode_bytes_read;
  const moe = s.experts > 0;
  const root = $("#arch-card");
  root.replaceChildren(...[
    h("h2", { class: "arch-name" }, card.name, h("span", { class: "muted small" }, `  ${s.model_type}`)),
    /random weights/i.test(card.name) ? h("p", { class: "random-weights-notice" },
      "Random weights: this model has the real architecture but untrained, random parameters; its text is noise.") : null,
    table("Parameters", [
      ["total", big(p.total), exact(p.total)],
      ["active per token", big(p.active), moe ? `${s.experts_per_token} of ${s.experts} routed experts + ${s.shared_experts} shared, in ${s.moe_layers} of ${s.layers} layers` : "dense: every parameter, every token"],
      ["attention", big(p.attention), s.is_mla ? `MLA: q rank ${s.q_lora_rank || "full"}, kv latent ${s.kv_lora_rank}, rope ${s.qk_rope_dim}` : `${s.heads} query heads, ${s.kv_heads} KV heads of ${s.head_dim}`],
      moe ? ["routed experts", big(p.routed_experts), `${big(p.active_routed_experts)} of them active per token`] : null,
      moe ? ["router", big(p.router), `groups: ${s.expert_groups}, kept per token: ${s.groups_per_token}; scale ${s.routed_scale}`] : null,
      ["embedding / lm head", `${big(p.embedding)} / ${big(p.lm_head)}`, s.tied_embeddings ? "tied: one matrix" : ""],
      ["weights", bytes(card.weights.bytes), `${card.weights.dtype}; active ${bytes(card.weights.active_bytes)}`],
    ]),
    h("div", { class: "arch-block" }, h("h2", {}, "KV cache per token"), kvBars(kv)),
    table(`KV cache at ${exact(kv.context)} tokens`, [
      ["cached", bytes(kv.bytes_at_context), `${kv.dtype}, ${exact(kv.values_per_token)} values per token`],
      ["expanded", bytes(kv.expanded_bytes_at_context), `${(kv.expanded_bytes_per_token / kv.bytes_per_token).toFixed(1)}x the cached form`],
      kv.sliding_window ? ["sliding window", `${exact(kv.sliding_window)} tokens`,
        "attention sees only the last tokens: the cache keeps at most this many, and a longer conversation cannot be reused from the prefix cache"] : null,
    ]),
    table(`FLOPs (context ${exact(f.context)})`, [
      ["decode, one token", flop(f.decode_per_token.as_run), s.is_mla ? "as transformers runs MLA: every cached latent re-expanded each step" : ""],
      s.is_mla ? ["decode, absorbed", flop(f.decode_per_token.absorbed), "kv_b folded into query and output, attention over latents (DeepSeek's inference)"] : null,
      ["prefill, per token", flop(f.prefill_per_token), `prefill of ${exact(f.context)} tokens: ${flop(f.prefill_total)} (logits of the last position only, the one sampled from)`],
    ]),
    card.vision ? visionTable(card.vision) : null,
    table("Bytes read per decoded token (batch 1)", [
      ["weights", bytes(read.weights), "each weight the token touches, once"],
      ["KV cache", bytes(read.kv_cache), `all ${exact(kv.context)} cached positions`],
      ["total", bytes(read.total), "at 3 TB/s of memory bandwidth: " + `${(3e12 / read.total).toFixed(1)} tokens/s at most`],
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
  select.append(
    h("optgroup", { label: "Registered models" }, models.map((m) => h("option", { value: `model:${m.id}` }, m.name))),
    h("optgroup", { label: "Real configs (no weights)" }, references.map((r) => h("option", { value: `ref:${r.key}` }, r.name))),
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
