// The note under a page's model picker: what the chosen model is (its one-line summary from
// /api/models/: how big, which languages; or why it cannot answer on this server) and where it
// stands on the workers, live from the page's socket (`worker.model` events, docs/protocol.md):
// "loading on gpu@host… 12 s" (counting), "loaded on gpu@host in 9.8 s", "failed to load: …",
// or "not loaded yet: the first request loads it". Owns only that note and the workers' states.
import { h } from "./dom.js";
import { fmtMs } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

export class ModelStatus {
  /** `select`: the model picker; `onTick`: called while a load is under way (every 500 ms). */
  constructor(select, { onTick = () => {} } = {}) {
    this.select = select;
    this.onTick = onTick;
    this.models = [];
    this.workers = new Map(); // worker -> its last worker.model event, with `receivedAt`
    this.summary = h("span", { class: "model-summary" });
    this.state = h("span", { class: "model-state" });
    this.note = h("p", { class: "model-note small", role: "status", "aria-live": "polite" }, this.summary, this.state);
    select.after(this.note);
    select.addEventListener("change", () => this.render());
    this.timer = null;
  }

  setModels(models) {
    this.models = models;
    this.render();
  }

  /** A `worker.model` event from the socket. */
  onWorkerModel(event) {
    this.workers.set(event.worker, { ...event, receivedAt: performance.now() });
    this.render();
  }

  /** The worker loading `modelId` now, with the load's elapsed ms, or null. */
  loading(modelId) {
    const w = [...this.workers.values()].find((e) => e.state === "loading" && e.model_id === modelId);
    return w ? { worker: w.worker, modelName: w.model_name, elapsedMs: w.elapsed_ms + performance.now() - w.receivedAt } : null;
  }

  render() {
    const id = Number(this.select.value) || null;
    const model = this.models.find((m) => m.id === id);
    this.summary.textContent = model?.unavailable
      ? interpolate(gettext("Not available here: %(reason)s"), { reason: model.unavailable }) : model?.summary ?? "";
    this.note.classList.toggle("is-unavailable", Boolean(model?.unavailable));
    this.state.textContent = model && !model.unavailable ? this.stateText(id) : "";
    this.note.hidden = !this.summary.textContent && !this.state.textContent;
    const isLoading = Boolean(this.loading(id));
    this.note.classList.toggle("is-loading", isLoading);
    if (isLoading && !this.timer) this.timer = setInterval(() => { this.render(); this.onTick(); }, 500);
    if (!isLoading && this.timer) { clearInterval(this.timer); this.timer = null; this.onTick(); }
  }

  stateText(modelId) {
    const events = [...this.workers.values()].filter((e) => e.model_id === modelId);
    const load = this.loading(modelId);
    // A leading space: the state follows the summary sentence in the same line.
    if (load) {
      return " " + interpolate(gettext("Loading on %(worker)s… %(time)s (answers wait for it)."),
        { worker: load.worker, time: fmtMs(load.elapsedMs) });
    }
    const ready = events.find((e) => e.state === "ready");
    if (ready) return " " + interpolate(gettext("Loaded on %(worker)s in %(time)s."), { worker: ready.worker, time: fmtMs(ready.load_ms) });
    const failed = events.find((e) => e.state === "error");
    if (failed) return " " + interpolate(gettext("Failed to load on %(worker)s: %(error)s"), { worker: failed.worker, error: failed.error });
    return this.workers.size ? " " + gettext("Not loaded on a worker yet: the first request loads it (a few seconds).") : "";
  }
}
