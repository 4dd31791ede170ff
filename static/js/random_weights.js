// "Random weights" notice: when the chosen model's name says its weights are random (the
// DeepSeek-V3 and DeepSeek-VL architecture demos, docs/deepseek.md), a notice appears under the model select of
// the chat and the explorer, and a link to its architecture card. Owns only that notice.
import { h } from "./dom.js";
import { gettext } from "./i18n.js";

const RANDOM = /random weights/i;
const VISION = /DeepSeek-VL/;
const SELECTS = ["#model-select", "#ex-model"];

function noticeText(name) {
  return VISION.test(name)
    ? gettext("Random weights: this model has DeepSeek-VL's real architecture (a SigLIP vision tower, its aligner, a small " +
      "language model) and image processor, but untrained, random parameters: it has never seen a picture and its " +
      "text is noise. Attach an image and watch its block of image tokens and their KV cache, not the answers.") + " "
    : gettext("Random weights: this model has DeepSeek-V3's real architecture (MLA, mixture of experts) but untrained, " +
      "random parameters, so its text is noise. Watch its KV cache and routing, not its answers.") + " ";
}

function watch(select) {
  const what = h("span", {});
  const notice = h("p", { class: "random-weights-notice", role: "note", hidden: true },
    what, h("a", { href: "/architecture/" }, gettext("Architecture card")));
  select.after(notice);
  let shown = null;
  const update = () => {
    const option = select.selectedOptions[0];
    const isRandom = Boolean(option && RANDOM.test(option.textContent));
    notice.querySelector("a").href = `/architecture/?model=model:${select.value}`;
    const text = isRandom ? noticeText(option.textContent) : "";
    if (text === shown) return;
    shown = text;
    what.textContent = text;
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
