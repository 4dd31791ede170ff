// "Random weights" notice: when the chosen model's name says its weights are random (the
// DeepSeek-V3 architecture demo, docs/deepseek.md), a notice appears under the model select of
// the chat and the explorer, and a link to its architecture card. Owns only that notice.
import { h } from "./dom.js";

const RANDOM = /random weights/i;
const SELECTS = ["#model-select", "#ex-model"];

function watch(select) {
  const notice = h("p", { class: "random-weights-notice", role: "note", hidden: true },
    "Random weights: this model has DeepSeek-V3's real architecture (MLA, mixture of experts) but untrained, ",
    "random parameters, so its text is noise. Watch its KV cache and routing, not its answers. ",
    h("a", { href: "/architecture/" }, "Architecture card"));
  select.after(notice);
  let shown = null;
  const update = () => {
    const option = select.selectedOptions[0];
    const isRandom = Boolean(option && RANDOM.test(option.textContent));
    notice.querySelector("a").href = `/architecture/?model=model:${select.value}`;
    if (isRandom === shown) return;
    shown = isRandom;
    notice.hidden = !isRandom;
  };
  select.addEventListener("change", update);
  new MutationObserver(update).observe(select, { childList: true, subtree: true });
  // the pages also set .value in code (opening a conversation), which fires no event
  setInterval(update, 1000);
  update();
}

for (const selector of SELECTS) {
  const select = document.querySelector(selector);
  if (select) watch(select);
}
