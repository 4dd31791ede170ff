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

export function $(selector, root = document) {
  const el = root.querySelector(selector);
  if (!el) throw new Error(`missing element ${selector}`);
  return el;
}

export function replaceChildren(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** Run `fn` at most once per animation frame, with the latest call's arguments. */
export function perFrame(fn) {
  let pending = null;
  return (...args) => {
    if (pending === null) requestAnimationFrame(() => { const a = pending; pending = null; fn(...a); });
    pending = args;
  };
}

/** Off-canvas panels on narrow screens: buttons with data-toggle-panel="sidebar" toggle body.show-sidebar. */
export function wirePanelToggles() {
  for (const btn of document.querySelectorAll("[data-toggle-panel]")) {
    btn.addEventListener("click", () => document.body.classList.toggle(`show-${btn.dataset.togglePanel}`));
  }
  document.querySelector(".scrim")?.addEventListener("click", () => {
    document.body.classList.remove("show-sidebar", "show-settings");
  });
}
