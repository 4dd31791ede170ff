// The sidebar's conversation list: load, select, rename inline, delete.
// Owns: the /api/conversations/ list calls; what a selected conversation shows is chat.js's.
import { api } from "./api.js";
import { h } from "./dom.js";
import { icon } from "./icons.js";
import { gettext, interpolate } from "./i18n.js";

export class ConversationList {
  constructor(listEl, { onSelect, onRenamed, onDeleted, onError }) {
    this.listEl = listEl;
    this.onSelect = onSelect;
    this.onRenamed = onRenamed;
    this.onDeleted = onDeleted;
    this.onError = onError;
    this.items = [];
    this.activeId = null;
  }

  async refresh() {
    try {
      this.items = await api("GET", "/api/conversations/");
    } catch (err) {
      this.onError(err);
      return;
    }
    this.render();
  }

  setActive(id) {
    this.activeId = id;
    this.render();
  }

  render() {
    if (!this.items.length) {
      this.listEl.replaceChildren(h("li", { class: "conv-empty" }, gettext("No conversations yet.")));
      return;
    }
    this.listEl.replaceChildren(...this.items.map((conv) => this.renderItem(conv)));
  }

  renderItem(conv) {
    const item = h("li", { class: "conv-item", "aria-current": String(conv.id === this.activeId), dataset: { id: conv.id } },
      h("span", { class: "conv-title", title: conv.title }, conv.title || gettext("Untitled")),
      h("button", { class: "icon-btn", type: "button", title: gettext("Rename"), "aria-label": interpolate(gettext("Rename %(title)s"), { title: conv.title }),
        onclick: (e) => { e.stopPropagation(); this.startRename(item, conv); } }, icon("edit", 15)),
      h("button", { class: "icon-btn", type: "button", title: gettext("Delete"), "aria-label": interpolate(gettext("Delete %(title)s"), { title: conv.title }),
        onclick: (e) => { e.stopPropagation(); this.remove(conv); } }, icon("trash", 15)));
    item.addEventListener("click", () => this.onSelect(conv.id));
    return item;
  }

  startRename(item, conv) {
    const input = h("input", { class: "input", value: conv.title || "", "aria-label": gettext("Conversation title"), maxlength: "200" });
    let isDone = false;
    const finish = async (save) => {
      if (isDone) return;
      isDone = true;
      const title = input.value.trim();
      if (save && title && title !== conv.title) {
        try {
          await api("PATCH", `/api/conversations/${conv.id}/`, { title });
          conv.title = title;
          this.onRenamed(conv);
        } catch (err) { this.onError(err); }
      }
      this.render();
    };
    input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") finish(true);
      if (e.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
    input.addEventListener("click", (e) => e.stopPropagation());
    item.replaceChildren(input);
    input.focus();
    input.select();
  }

  async remove(conv) {
    if (!window.confirm(interpolate(gettext("Delete “%(title)s”? This cannot be undone."), { title: conv.title || gettext("Untitled") }))) return;
    try {
      await api("DELETE", `/api/conversations/${conv.id}/`);
    } catch (err) {
      this.onError(err);
      return;
    }
    this.items = this.items.filter((c) => c.id !== conv.id);
    this.render();
    this.onDeleted(conv.id);
  }
}
