// The serving page: every worker's continuous-batching steps as they happen, from the
// /ws/serving/ socket (docs/continuous-batching.md). Owns: the socket (reconnecting), the
// per-worker summary cards and the step rows. Each row is one engine step of one worker:
// its width is the step's token budget, each segment one request's chunk of it.
import { h, $ } from "./dom.js";
import { fmtMs } from "./format.js";

const MAX_ROWS = 60;
const workers = new Map();  // worker name -> its last step message

function connect(delayMs = 500) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/serving/`);
  const conn = $("#conn");
  const setState = (state, label) => { conn.dataset.state = state; conn.querySelector(".conn-label").textContent = label; };
  socket.addEventListener("open", () => { setState("open", "Live"); delayMs = 500; });
  socket.addEventListener("message", (e) => {
    const message = JSON.parse(e.data);
    if (message.type === "serving.step") onStep(message);
  });
  socket.addEventListener("close", () => {
    setState("closed", "Reconnecting…");
    setTimeout(() => connect(Math.min(delayMs * 2, 8000)), delayMs);
  });
}

function onStep(message) {
  workers.set(message.worker, message);
  renderCards();
  const rows = $("#sv-steps");
  rows.prepend(stepRow(message));
  while (rows.children.length > MAX_ROWS) rows.lastChild.remove();
  $("#sv-skipped").textContent = message.num_skipped
    ? `(${message.num_skipped} steps between these rows were not sent: the view shows at most 10 a second)` : "";
}

function stepRow({ worker, step }) {
  const bar = h("div", { class: "sv-bar", role: "img", "aria-label": describe(step) });
  for (const chunk of step.chunks) {
    const who = chunk.generation_id ?? `request ${chunk.request_id}`;
    const title = chunk.kind === "decode"
      ? `generation ${who}: decode, token ${chunk.start + 1}`
      : `generation ${who}: prefill chunk of ${chunk.num_tokens} tokens (positions ${chunk.start}–${chunk.start + chunk.num_tokens - 1})${chunk.samples ? ", samples its first token" : ""}`;
    const seg = h("span", { class: `sv-seg sv-${chunk.kind}`, title }, chunk.num_tokens >= 6 ? `#${who}` : "");
    seg.style.flexGrow = String(chunk.num_tokens);
    bar.append(seg);
  }
  const unused = step.max_num_batched_tokens - step.num_batched_tokens;
  if (unused > 0) {
    const free = h("span", { class: "sv-seg sv-free", title: `${unused} tokens of the budget unused` });
    free.style.flexGrow = String(unused);
    bar.append(free);
  }
  const decodes = step.chunks.filter((c) => c.kind === "decode").length;
  const prefills = step.chunks.length - decodes;
  const summary = [decodes && `${decodes} decode`, prefills && `${prefills} prefill`].filter(Boolean).join(" · ");
  const preempted = step.preempted_ids.length ? ` · preempted #${step.preempted_ids.join(", #")}` : "";
  return h("li", { class: "sv-row" },
    h("span", { class: "sv-meta mono" }, `${worker.split("@")[0]} · step ${step.index} · ${fmtMs(step.step_ms)}`),
    bar, h("span", { class: `sv-meta mono${preempted ? " sv-preempted" : ""}` }, `${summary} · ${step.num_batched_tokens} tok${preempted}`));
}

function describe(step) {
  const decodes = step.chunks.filter((c) => c.kind === "decode").length;
  const prefills = step.chunks.length - decodes;
  return `step ${step.index}: ${decodes} decodes, ${prefills} prefill chunks, ${step.num_batched_tokens} of ${step.max_num_batched_tokens} tokens`;
}

function renderCards() {
  const cards = [...workers.values()].map(({ worker, step }) => {
    const b = step.blocks;
    const pct = (n) => `${Math.round((100 * n) / Math.max(b.num_blocks, 1))}%`;
    const kv = h("div", { class: "sv-kv", title: "KV blocks: used by running requests | cached (free, kept by prefix hash) | empty" });
    for (const [cls, n] of [["sv-used", b.num_used_blocks], ["sv-cached", b.num_cached_free_blocks],
      ["sv-empty", b.num_free_blocks - b.num_cached_free_blocks]]) {
      const seg = h("span", { class: cls });
      seg.style.width = pct(n);
      kv.append(seg);
    }
    return h("div", { class: "card sv-card" },
      h("div", { class: "sv-card-head" }, h("b", {}, worker), h("span", { class: "muted small" }, ` step ${step.index}`)),
      h("div", { class: "sv-numbers" },
        number("running", step.num_running, "requests in the batch"),
        number("waiting", step.num_waiting, "requests waiting for a place in the batch"),
        number("tokens", `${step.num_batched_tokens}/${step.max_num_batched_tokens}`, "tokens in this step / the step's budget"),
        number("step", fmtMs(step.step_ms), "time of this step: one forward pass for everyone, plus sampling"),
        number("preempted", step.num_preemptions, "requests preempted since the worker started (out of KV blocks)"),
        number("prefix hits", `${Math.round(100 * (b.hit_rate ?? 0))}%`, "prompt tokens served from shared blocks, over all prompt tokens")),
      h("div", { class: "small muted" },
        `KV blocks (${b.block_size} tokens each): ${b.num_used_blocks} used, ${b.num_shared_blocks} shared, `
        + `${b.num_cached_free_blocks} cached, ${b.num_free_blocks - b.num_cached_free_blocks} empty of ${b.num_blocks}`),
      kv);
  });
  $("#sv-cards").replaceChildren(...cards);
}

function number(label, value, title) {
  return h("div", { class: "sv-number", title }, h("span", { class: "sv-value" }, String(value)), h("span", { class: "sv-label" }, label));
}

connect();
