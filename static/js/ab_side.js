// One side (A or B) of the A/B page: a sampling preset or its own sliders. Owns: the side's
// controls (#ab-<side>-preset and the sliders), what its `complete` command carries
// (`preset_id` and `overrides`) and its label. Must not know: the socket, the other side.
import { $, bindSlider, h } from "./dom.js";
import { SETTING_FORMATS, presetName } from "./format.js";
import { gettext } from "./i18n.js";

const SLIDER_IDS = { temperature: "temperature", top_k: "top-k", top_p: "top-p", min_p: "min-p" };

/** `presets` from /api/presets/ (beam-search ones left out by the caller); `preset` is selected first. */
export function createSide(name, presets, preset) {
  const select = $(`#ab-${name}-preset`);
  let isApplying = false;  // a preset moving the sliders is not the user choosing custom settings
  const sliders = Object.fromEntries(Object.entries(SLIDER_IDS).map(([key, id]) => [key,
    bindSlider(`#ab-${name}-${id}`, SETTING_FORMATS[key], () => { if (!isApplying) select.value = ""; })]));
  select.replaceChildren(h("option", { value: "" }, gettext("Custom (the sliders)")),
    ...presets.map((p) => h("option", { value: p.id }, presetName(p.name))));
  const chosen = () => presets.find((p) => String(p.id) === select.value) ?? null;

  /** Shows the chosen preset's values on the sliders (greedy as temperature 0). */
  function showPreset() {
    const p = chosen();
    if (!p) return;
    const values = { ...p.params, temperature: p.params.greedy ? 0 : p.params.temperature };
    isApplying = true;
    for (const [key, input] of Object.entries(sliders)) {
      input.value = values[key];
      input.dispatchEvent(new Event("input"));
    }
    isApplying = false;
  }

  select.addEventListener("change", showPreset);
  select.value = preset ? String(preset.id) : "";
  showPreset();
  return {
    name,
    get label() { return chosen() ? presetName(chosen().name) : gettext("custom"); },
    /** The side's fields of a `complete` command; `common` (length, seed) applies to both sides. */
    command(common) {
      const p = chosen();
      if (p) return { preset_id: p.id, overrides: common };
      const values = Object.fromEntries(Object.entries(sliders).map(([key, input]) => [key, Number(input.value)]));
      // The sliders are the whole setting (temperature 0 is greedy), not overrides of the default preset.
      return { overrides: { ...values, greedy: false, repetition_penalty: 1.0, ...common } };
    },
  };
}
