// The serving page: every worker's continuous-batching steps as they happen, from the
// /ws/serving/ socket (docs/continuous-batching.md). Owns: the socket (reconnecting), the
// per-worker summary cards and the step rows. Each row is one engine step of one worker:
// its width is the step's token budget, each segment one request's chunk of it.
import { h, $ } from "./dom.js";
import { fmtMs, phaseLabel } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

const MAX_ROWS = 60;
const workers = new Map();  // worker name -> its last step message

function connect(delayMs = 500) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/serving/`);
  const conn = $("#conn");
  const setState = (state, label) => { conn.dataset.state = state; conn.querySelector(".conn-label").textContent = label; };
  socket.addEventListener("open", () => { setState("open", gettext("Live")); delayMs = 500; });
  socket.addEventListener("message", (e) => {
    const message = JSON.parse(e.data);
    if (message.type === "serving.step") onStep(message);
  });
  socket.addEventListener("close", () => {
    setState("closed", gettext("Reconnecting…"));
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
    ? interpolate(gettext("(%(n)s steps between these rows were not sent: the view shows at most 10 a second)"), { n: message.num_skipped }) : "";
}

function stepRow({ worker, step }) {
  const bar = h("div", { class: "sv-bar", role: "img", "aria-label": describe(step) });
  for (const chunk of step.chunks) {
    const who = chunk.generation_id ?? interpolate(gettext("request %(id)s"), { id: chunk.request_id });
    const title = chunk.kind === "decode"
      ? interpolate(gettext("generation %(who)s: decode, token %(n)s"), { who, n: chunk.start + 1 })
      : interpolate(gettext("generation %(who)s: prefill chunk of %(n)s tokens (positions %(first)s–%(last)s)"),
        { who, n: chunk.num_tokens, first: chunk.start, last: chunk.start + chunk.num_tokens - 1 })
        + (chunk.samples ? gettext(", samples its first token") : "");
    const seg = h("span", { class: `sv-seg sv-${chunk.kind}`, title }, chunk.num_tokens >= 6 ? `#${who}` : "");
    seg.style.flexGrow = String(chunk.num_tokens);
    bar.append(seg);
  }
  const unused = step.max_num_batched_tokens - step.num_batched_tokens;
  if (unused > 0) {
    const free = h("span", { class: "sv-seg sv-free", title: interpolate(gettext("%(n)s tokens of the budget unused"), { n: unused }) });
    free.style.flexGrow = String(unused);
    bar.append(free);
  }
  const decodes = step.chunks.filter((c) => c.kind === "decode").length;
  const prefills = step.chunks.length - decodes;
  const summary = [decodes && `${decodes} ${phaseLabel("decode")}`, prefills && `${prefills} ${phaseLabel("prefill")}`].filter(Boolean).join(" · ");
  const preempted = step.preempted_ids.length ? ` · ${interpolate(gettext("preempted %(ids)s"), { ids: `#${step.preempted_ids.join(", #")}` })}` : "";
  return h("li", { class: "sv-row" },
    h("span", { class: "sv-meta mono" }, `${worker.split("@")[0]} · ${interpolate(gettext("step %(step)s"), { step: step.index })} · ${fmtMs(step.step_ms)}`),
    bar, h("span", { class: `sv-meta mono${preempted ? " sv-preempted" : ""}` }, `${summary} · ${step.num_batched_tokens} tok${preempted}`));
}

function describe(step) {
  const decodes = step.chunks.filter((c) => c.kind === "decode").length;
  const prefills = step.chunks.length - decodes;
  return interpolate(gettext("step %(step)s: %(decodes)s decodes, %(prefills)s prefill chunks, %(n)s of %(budget)s tokens"),
    { step: step.index, decodes, prefills, n: step.num_batched_tokens, budget: step.max_num_batched_tokens });
}

function renderCards() {
  const cards = [...workers.values()].map(({ worker, step }) => {
    const b = step.blocks;
    const pct = (n) => `${Math.round((100 * n) / Math.max(b.num_blocks, 1))}%`;
    const kv = h("div", { class: "sv-kv", title: gettext("KV blocks: used by running requests | cached (free, kept by prefix hash) | empty") });
    for (const [cls, n] of [["sv-used", b.num_used_blocks], ["sv-cached", b.num_cached_free_blocks],
      ["sv-empty", b.num_free_blocks - b.num_cached_free_blocks]]) {
      const seg = h("span", { class: cls });
      seg.style.width = pct(n);
      kv.append(seg);
    }
    return h("div", { class: "card sv-card" },
      h("div", { class: "sv-card-head" }, h("b", {}, worker), h("span", { class: "muted small" }, " ", interpolate(gettext("step %(step)s"), { step: step.index }))),
      h("div", { class: "sv-numbers" },
        number(gettext("running"), step.num_running, gettext("requests in the batch")),
        number(gettext("waiting"), step.num_waiting, gettext("requests waiting for a place in the batch")),
        number(gettext("tokens"), `${step.num_batched_tokens}/${step.max_num_batched_tokens}`, gettext("tokens in this step / the step's budget")),
        number(gettext("step"), fmtMs(step.step_ms), gettext("time of this step: one forward pass for everyone, plus sampling")),
        number(gettext("preempted"), step.num_preemptions, gettext("requests preempted since the worker started (out of KV blocks)")),
        number(gettext("prefix hits"), `${Math.round(100 * (b.hit_rate ?? 0))}%`, gettext("prompt tokens served from shared blocks, over all prompt tokens"))),
      h("div", { class: "small muted" },
        interpolate(gettext("KV blocks (%(size)s tokens each): %(used)s used, %(shared)s shared, %(cached)s cached, %(empty)s empty of %(n)s"),
          { size: b.block_size, used: b.num_used_blocks, shared: b.num_shared_blocks, cached: b.num_cached_free_blocks,
            empty: b.num_free_blocks - b.num_cached_free_blocks, n: b.num_blocks })),
      kv);
  });
  $("#sv-cards").replaceChildren(...cards);
}

function number(label, value, title) {
  return h("div", { class: "sv-number", title }, h("span", { class: "sv-value" }, String(value)), h("span", { class: "sv-label" }, label));
}

connect();
