// Small pieces every section of the lesson page draws with. Owns: a section's state
// (idle / running / done / error, on its `data-state`, which the tests wait for), the measured
// numbers as a list whose items carry the raw value (`data-measure`, `data-value`), and a
// failure or an explanation in place of a result. Must not know requests or sections.
import { h } from "./dom.js";
import { cutCharacterBytes, errorText } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

/** Marks `section` (an element with data-state) and disables its buttons while it runs. */
export function setState(section, state) {
  section.dataset.state = state;
  for (const button of section.querySelectorAll(".learn-controls button")) button.disabled = state === "running";
}

/** One measured number: `name` for tests, `label` for people, `text` as shown, `value` raw. */
export function measure(name, label, text, value = null, title = undefined) {
  return h("div", { class: "learn-number", dataset: { measure: name, value: value ?? "" }, title },
    h("dt", {}, label), h("dd", {}, text));
}

/**
 * A finished run's text as the chat shows it: a character its end cut (the token limit fell inside
 * a multi-byte character) is left out, not shown as "�" (format.js cutCharacterBytes).
 * -> {text, cut}: `cut` is a muted "…" whose title says which bytes, or null.
 */
export function shownText(run) {
  // a beam search streams no steps: its text's own end tells
  const cutBytes = cutCharacterBytes(run.steps.at(-1) ?? { text_delta: run.text }, run.finish_reason);
  if (cutBytes === null) return { text: run.text, cut: null };
  const title = cutBytes ? interpolate(gettext("ended inside a character (%(bytes)s)"), { bytes: cutBytes })
    : gettext("ended inside a character");
  return { text: run.text.replace(/\ufffd+$/, ""), cut: h("span", { class: "muted learn-cut", title }, "…") };
}

export function numbers(items) {
  return h("dl", { class: "learn-numbers" }, items.filter(Boolean));
}

/** A request or page failure, with its stable code. */
export function failure(error) {
  return h("p", { class: "alert learn-error", role: "alert" }, errorText(error));
}

/** Not an error: what this server cannot show right now, and how to make it show it. */
export function explanation(title, ...lines) {
  return h("div", { class: "learn-explanation" }, h("b", {}, title), ...lines.map((line) => h("p", {}, line)));
}

/** A "running" line while requests are in flight. */
export function progress(text = gettext("Running on the model…")) {
  return h("p", { class: "muted learn-progress" }, text);
}

/** Runs `work()` with the section marked running; shows a failure in `resultEl` if it throws. */
export async function runSection(section, resultEl, work) {
  setState(section, "running");
  try {
    await work();
    setState(section, "done");
  } catch (err) {
    console.warn(err);
    for (const line of resultEl.querySelectorAll(".learn-progress")) line.remove();
    resultEl.append(failure(err));
    setState(section, "error");
  }
}
