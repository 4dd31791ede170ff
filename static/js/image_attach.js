// Images attached to the next message (vision-language models, docs/deepseek.md): an "Attach
// image" file button, paste into the text box and drop onto the form, a thumbnail tray with a
// remove button each. Owns only the pending images; the page sends them (`take()`) as the
// command's `images` ({data: base64, media_type}) and puts them back (`restore()`) if refused.
// The server checks every image again (invalid_image, image_too_large, ...).
import { h } from "./dom.js";
import { fmtBytes } from "./format.js";
import { icon } from "./icons.js";
import { gettext, interpolate } from "./i18n.js";

const TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp"];
const MAX_BYTES = 1024 * 1024;  // PLAYGROUND_MAX_IMAGE_BYTES' default: refuse early, without a round trip
const MAX_IMAGES = 4;  // PLAYGROUND_MAX_IMAGES' default

/** Thumbnails of stored or pending images ({data, media_type}); used by messages too. */
export function thumbnails(images, onRemove = null) {
  return h("div", { class: "image-thumbs" }, images.map((image, i) =>
    h("figure", { class: "image-thumb" },
      h("img", { src: `data:${image.media_type};base64,${image.data}`, alt: image.name || interpolate(gettext("image %(n)s"), { n: i + 1 }) }),
      onRemove && h("button", { class: "icon-btn image-remove", type: "button", title: gettext("Remove the image"),
        "aria-label": interpolate(gettext("Remove image %(n)s"), { n: i + 1 }), onclick: () => onRemove(i) }, icon("x", 12)))));
}

export class ImageAttachments {
  /** `form`: drop target; `input`: paste target; `tray`: where thumbnails go; `onError(message)`;
   * `onChange()` after every change (the explorer starts over). */
  constructor({ form, input, tray, button, onError, onChange = () => {} }) {
    this.images = [];
    this.tray = tray;
    this.button = button;
    this.refusal = null;  // why images cannot be attached now (a text-only model), or null
    this.onError = onError;
    this.onChange = onChange;
    const picker = h("input", { type: "file", accept: TYPES.join(","), multiple: true, hidden: true, class: "image-picker",
      onchange: () => { this.addFiles([...picker.files]); picker.value = ""; } });
    button.after(picker);
    button.addEventListener("click", () => picker.click());
    input.addEventListener("paste", (e) => {
      const files = [...(e.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
      if (files.length) { e.preventDefault(); this.addFiles(files); }
    });
    form.addEventListener("dragover", (e) => { e.preventDefault(); form.classList.add("dropping"); });
    form.addEventListener("dragleave", () => form.classList.remove("dropping"));
    form.addEventListener("drop", (e) => {
      e.preventDefault();
      form.classList.remove("dropping");
      this.addFiles([...(e.dataTransfer?.files || [])]);
    });
    this.show();
  }

  /** Offer images only for a model that takes them (`/api/models/` `accepts_images`: false is
   * refused by the server; null, unknown, is left to the worker). */
  setModel(model) {
    this.refusal = model?.accepts_images === false ? interpolate(gettext("%(name)s takes no images: choose a vision-language model."), { name: model.name }) : null;
    this.button.hidden = this.refusal !== null;
  }

  async addFiles(files) {
    if (files.length && this.refusal) { this.onError(this.refusal); return; }
    for (const file of files) {
      if (this.images.length >= MAX_IMAGES) { this.onError(interpolate(gettext("At most %(n)s images per message."), { n: MAX_IMAGES })); break; }
      if (!TYPES.includes(file.type)) { this.onError(interpolate(gettext("%(name)s: use a PNG, JPEG, GIF or WebP image."), { name: file.name })); continue; }
      if (file.size > MAX_BYTES) { this.onError(interpolate(gettext("%(name)s has %(size)s; the limit is %(limit)s."),
        { name: file.name, size: fmtBytes(file.size), limit: fmtBytes(MAX_BYTES) })); continue; }
      const dataUrl = await new Promise((resolve, reject) => {
        const reader = new FileReader();
        reader.onload = () => resolve(reader.result);
        reader.onerror = () => reject(reader.error);
        reader.readAsDataURL(file);
      });
      this.images.push({ data: dataUrl.slice(dataUrl.indexOf(",") + 1), media_type: file.type, name: file.name });
    }
    this.render();
  }

  /** The images for a command ({data, media_type}); they stay (the explorer resends them). */
  current() {
    return this.images.map(({ data, media_type }) => ({ data, media_type }));
  }

  /** The pending images for a command; the tray empties (the chat's next message has none). */
  take() {
    const images = this.current();
    this.images = [];
    this.render();
    return images;
  }

  restore(images) {
    this.images = [...images, ...this.images];
    this.render();
  }

  render() {
    this.show();
    this.onChange();
  }

  show() {
    this.tray.hidden = !this.images.length;
    this.tray.replaceChildren(thumbnails(this.images, (i) => { this.images.splice(i, 1); this.render(); }));
  }
}
