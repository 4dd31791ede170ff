// Tiny DOM helpers shared by both pages. Text always goes in through textContent; the only
// HTML these pages insert comes from markdown.js, sanitized.

/** h("div", {class: "x", onclick: fn, dataset: {i: 1}}, child, "text") -> Element */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") el.style.cssText = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

/** A range input `selector` whose `<output id="<selector>-value">` shows `format(value)`; `onInput` after each move. */
export function bindSlider(selector, format, onInput) {
  const input = $(selector);
  const output = $(`${selector}-value`);
  const show = () => { output.textContent = format(Number(input.value)); };
  input.addEventListener("input", () => { show(); onInput(); });
  show();
  return input;
}

export function $(selector, root = document) {
  const el = root.querySelector(selector);
  if (!el) throw new Error(`missing element ${selector}`);
  return el;
}

/**
 * Off-canvas panels on narrow screens: a button with data-toggle-panel="sidebar" toggles
 * body.show-sidebar; the scrim or Escape closes any open panel.
 */
export function wirePanelToggles() {
  const closeAll = () => document.body.classList.remove("show-sidebar", "show-settings");
  for (const btn of document.querySelectorAll("[data-toggle-panel]")) {
    btn.addEventListener("click", () => document.body.classList.toggle(`show-${btn.dataset.togglePanel}`));
  }
  document.querySelector(".scrim")?.addEventListener("click", closeAll);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") closeAll(); });
}

/**
 * A model picker that shows the chosen name whole. A native <select> cuts a name longer than its
 * box ("Qwen2.5-Coder-0.5B-Instruct (bundl…" in a 320 px panel at 1280 px); here the select stays
 * (keyboard, screen readers, its own list of options) but transparent, over a box that shows the
 * chosen option's text and wraps it. The select's `.field` stacks the two in one grid cell
 * (app.css `.picker-field`); notes placed after the select go below.
 */
export function wholeNamePicker(select) {
  const shown = h("span", { class: "picker-text", "aria-hidden": "true" });
  select.before(shown);
  select.parentElement.classList.add("picker-field");
  const update = () => { shown.textContent = select.selectedOptions[0]?.textContent ?? ""; };
  // the pages also set .value in code (opening a conversation, a link's model), which fires no event
  for (const name of ["value", "selectedIndex"]) {
    const own = Object.getOwnPropertyDescriptor(HTMLSelectElement.prototype, name);
    Object.defineProperty(select, name, {
      configurable: true, get: () => own.get.call(select), set: (value) => { own.set.call(select, value); update(); },
    });
  }
  select.addEventListener("change", update);
  new MutationObserver(update).observe(select, { childList: true, subtree: true, characterData: true });
  update();
}
