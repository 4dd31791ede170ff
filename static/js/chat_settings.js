// The chat page's settings panel: model, sampling preset, system prompt, the inline
// overrides and the PD toggle. Owns: loading /api/models/ and /api/presets/, showing the
// preset's values as placeholders, and turning filled-in fields into an `overrides` object
// (empty = preset), the grammar and speculative decoding included (never a preset's).
import { getJson } from "./api.js";
import { $, h } from "./dom.js";
import { presetName } from "./format.js";
import { grammarField } from "./grammar.js";
import { gettext, interpolate } from "./i18n.js";

// field id -> SamplingParams name, parser and bounds (the server validates again).
// `isSampling`: only random sampling reads it; greedy and beam search pick tokens without it.
const OVERRIDE_FIELDS = {
  "ov-temperature": { name: "temperature", parse: Number, min: 0, max: 100, isSampling: true },
  "ov-top-k": { name: "top_k", parse: Number, min: 0, integer: true, isSampling: true },
  "ov-top-p": { name: "top_p", parse: Number, min: 0, max: 1, isSampling: true },
  // every decoding reads it, greedy and beam search too: it changes which token scores highest
  "ov-repetition-penalty": { name: "repetition_penalty", parse: Number, above: 0, max: 100 },
  // a select: "" is the preset's, "true"/"false" the choice
  "ov-penalize-prompt": { name: "penalize_prompt", parse: (v) => v === "true", isChoice: true },
  "ov-max-tokens": { name: "max_new_tokens", parse: Number, min: 1, integer: true },
  "ov-seed": { name: "seed", parse: Number, min: 0, max: Number.MAX_SAFE_INTEGER, integer: true, isSampling: true },  // max: the server's
  "ov-max-thinking": { name: "max_thinking_tokens", parse: Number, min: 0, integer: true },
};
const GENERIC_SYSTEM_PROMPT = gettext("Optional: instructions sent before the conversation");

export class OverrideError extends Error {}

export class ChatSettings {
  /** `onChange(patch)`: a setting the conversation keeps changed; `modelStatus`: the chosen
   * model's note (model_status.js); `onModel(model)`: the chosen model changed (its
   * /api/models/ record). */
  constructor(onChange, modelStatus = null, onModel = () => {}) {
    this.onChange = onChange;
    this.modelStatus = modelStatus;
    this.onModel = onModel;
    this.models = [];
    this.presets = [];
    this.modelSelect = $("#model-select");
    this.presetSelect = $("#preset-select");
    this.systemPrompt = $("#system-prompt");
    this.pdToggle = $("#pd-toggle");
    this.speculative = $("#ov-speculative");
    this.modelSelect.addEventListener("change", () => { this.showModel(); onChange({ model_id: this.modelId }); });
    this.presetSelect.addEventListener("change", () => { this.showPresetPlaceholders(); onChange({ preset_id: this.presetId }); });
    this.systemPrompt.addEventListener("change", () => onChange({ system_prompt: this.systemPrompt.value }));
    $("#reset-overrides").addEventListener("click", () => this.resetOverrides());
    this.grammar = grammarField("ov");
    for (const id of Object.keys(OVERRIDE_FIELDS)) {
      $(`#${id}`).addEventListener("input", (e) => e.target.removeAttribute("aria-invalid"));
    }
    // A temperature typed under a greedy preset asks for sampling: the other fields' hints follow it.
    $("#ov-temperature").addEventListener("input", () => this.showPresetPlaceholders());
  }

  async load() {
    [this.models, this.presets] = await Promise.all([getJson("/api/models/"), getJson("/api/presets/")]);
    // Names only: a 300 px panel cuts longer labels ("… (bundlec"); the context is in the title.
    fillSelect(this.modelSelect, this.models, (m) => m.name,
      (m) => (m.max_context ? interpolate(gettext("%(name)s: at most %(n)s tokens of context"),
        { name: m.name, n: m.max_context.toLocaleString() }) : m.name));
    fillSelect(this.presetSelect, this.presets, (p) => presetName(p.name));
    this.modelStatus?.setModels(this.models);
    this.showPresetPlaceholders();
    this.showModel();
  }

  get modelId() { return this.modelSelect.value ? Number(this.modelSelect.value) : null; }
  get presetId() { return this.presetSelect.value ? Number(this.presetSelect.value) : null; }

  modelName(modelId) { return this.models.find((m) => m.id === modelId)?.name ?? ""; }

  get model() { return this.models.find((m) => m.id === this.modelId) ?? null; }

  /** Show a conversation's own settings (null: a new chat keeps the current choices). */
  showConversation(conversation) {
    if (!conversation) { this.systemPrompt.value = ""; return; }
    if (conversation.model_id) {
      this.modelSelect.value = conversation.model_id;
      this.showModel();
      this.modelStatus?.render();
    }
    if (conversation.preset_id) { this.presetSelect.value = conversation.preset_id; this.showPresetPlaceholders(); }
    this.systemPrompt.value = conversation.system_prompt || "";
  }

  /** Each field's placeholder is the preset's value, or why the preset does not use it. */
  showPresetPlaceholders() {
    const params = this.presets.find((p) => p.id === this.presetId)?.params ?? {};
    // [short, long]: the placeholder has room for a word only
    const isGreedy = !(params.num_beams > 1) && (params.greedy || params.temperature === 0);
    // A temperature typed here makes a greedy preset sample (SamplingParams.resolve_overrides;
    // 0 stays greedy): then top-k, top-p and the seed apply too.
    const typed = Number($("#ov-temperature").value.trim() || "0");
    const isSampledAnyway = isGreedy && Number.isFinite(typed) && typed > 0;
    const unusedBy = params.num_beams > 1 ? [gettext("beams"), gettext("beam search")]
      : isGreedy && !isSampledAnyway ? [gettext("greedy"), gettext("greedy")] : null;
    for (const [id, spec] of Object.entries(OVERRIDE_FIELDS)) {
      const input = $(`#${id}`);
      const value = params[spec.name];
      if (spec.isChoice) {  // a select has no placeholder: its empty option names the preset's choice
        const chosen = [...input.options].find((o) => o.value === String(value));
        input.options[0].textContent = chosen ? interpolate(gettext("preset (%(value)s)"), { value: chosen.textContent })
          : gettext("preset");
        continue;
      }
      if (spec.name === "temperature" && isGreedy) {  // the one field that turns sampling on
        input.placeholder = gettext("greedy (type one to sample)");
        input.title = gettext("The preset is greedy: it takes the most likely token each time. A temperature above 0 typed here makes this answer sample instead (0 stays greedy).");
        continue;
      }
      const isUnused = spec.isSampling && unusedBy !== null;
      input.placeholder = isUnused ? interpolate(gettext("n/a (%(method)s)"), { method: unusedBy[0] })
        : value === null || value === undefined ? gettext("preset") : String(value);
      input.title = !isUnused ? ""
        : params.num_beams > 1 ? interpolate(gettext("%(method)s picks each token without %(name)s: a value here changes nothing"),
          { method: unusedBy[1], name: spec.name })
        : interpolate(gettext("greedy picks each token without %(name)s: a value here changes nothing unless a temperature above 0 is set too"),
          { name: spec.name });
    }
  }

  /** What follows the chosen model: the system prompt's placeholder (what the model's template
   * sends when the box is empty), the select's title (its full name), and `onModel`. */
  showModel() {
    const model = this.model;
    const injected = model?.default_system_prompt;
    this.systemPrompt.placeholder = injected ? interpolate(gettext("Empty: the template sends its own, “%(prompt)s”"), { prompt: injected })
      : GENERIC_SYSTEM_PROMPT;
    this.modelSelect.title = this.modelSelect.selectedOptions[0]?.title ?? "";
    this.onModel(model);
  }

  /** The filled-in fields as SamplingParams overrides; OverrideError names a bad field. */
  overrides() {
    const overrides = {};
    for (const [id, spec] of Object.entries(OVERRIDE_FIELDS)) {
      const input = $(`#${id}`);
      const raw = input.value.trim();
      if (raw === "") continue;
      const value = spec.parse(raw);
      const bad = !spec.isChoice && (!Number.isFinite(value) || (spec.integer && !Number.isInteger(value))
        || (spec.min !== undefined && value < spec.min) || (spec.max !== undefined && value > spec.max)
        || (spec.above !== undefined && value <= spec.above));
      if (bad) {
        input.setAttribute("aria-invalid", "true");
        input.focus();
        throw new OverrideError(interpolate(gettext("%(field)s: \"%(value)s\" is not a valid value."),
          { field: input.labels[0]?.textContent ?? spec.name, value: raw }));
      }
      overrides[spec.name] = value;
    }
    // never a preset's: absent is off
    if (this.speculative.value !== "off") overrides.speculative = this.speculative.value;
    try {
      const grammar = this.grammar.spec();
      if (grammar) overrides.grammar = grammar;
    } catch (err) {
      this.grammar.text.focus();
      throw new OverrideError(err.message);
    }
    return overrides;
  }

  /**
   * What every generating command carries: the chosen model and preset, the overrides, and
   * `pd: true` when disaggregation is ticked (absent otherwise: the server's mode applies).
   */
  commandFields() {
    // What the user set, as set: the server resolves it against the preset (a temperature asks
    // for sampling even under a greedy preset: SamplingParams.resolve_overrides) and echoes the
    // result as generation.started's `params`, which the answer keeps (run_state.js) and shows.
    const fields = { overrides: this.overrides() };
    if (this.modelId !== null) fields.model_id = this.modelId;
    if (this.presetId !== null) fields.preset_id = this.presetId;
    if (this.pdToggle.checked) fields.pd = true;
    return fields;
  }

  resetOverrides() {
    for (const id of Object.keys(OVERRIDE_FIELDS)) {
      const input = $(`#${id}`);
      input.value = "";
      input.removeAttribute("aria-invalid");
    }
    this.grammar.set("", "");
    this.speculative.value = "off";
    this.showPresetPlaceholders();
  }
}

function fillSelect(select, items, label, title = label) {
  select.replaceChildren(...items.map((item) => h("option", { value: item.id, title: title(item) }, label(item))));
  const preferred = items.find((item) => item.is_default) ?? items[0];
  if (preferred) select.value = preferred.id;
}
