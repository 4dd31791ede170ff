// The serving page: every worker's continuous-batching steps as they happen, from the
// /ws/serving/ socket (docs/continuous-batching.md). Owns: the socket (reconnecting), the
// per-worker summary cards (a card for each live worker, idle ones too) and the step rows. Each
// row is one engine step of one worker, each segment one request's chunk of it, as long as the
// tokens it ran: the rows share one scale, the longest step shown filling the row (a decode
// step of 3 tokens would be invisible against a 2,048-token budget).
import { h, $ } from "./dom.js";
import { fmtMs, phaseLabel } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

const MAX_ROWS = 60;
const MIN_SCALE = 16;  // tokens that fill a row at least: a lone decode token is not a full bar
const workers = new Map();  // worker name -> its last step message (null: alive, no step seen)
const rows = [];  // {el, bar, numTokens}, newest first

function connect(delayMs = 500) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const socket = new WebSocket(`${scheme}://${location.host}/ws/serving/`);
  const conn = $("#conn");
  const setState = (state, label) => { conn.dataset.state = state; conn.querySelector(".conn-label").textContent = label; };
  socket.addEventListener("open", () => { setState("open", gettext("Live")); delayMs = 500; });
  socket.addEventListener("message", (e) => {
    const message = JSON.parse(e.data);
    if (message.type === "serving.step") onStep(message);
    if (message.type === "serving.workers") onWorkers(message.workers);
  });
  socket.addEventListener("close", () => {
    setState("closed", gettext("Reconnecting…"));
    setTimeout(() => connect(Math.min(delayMs * 2, 8000)), delayMs);
  });
}

/** The workers alive when the page connected: an idle one runs no steps, so it is named here. */
function onWorkers(names) {
  for (const name of names) if (!workers.has(name)) workers.set(name, null);
  renderCards();
}

function onStep(message) {
  workers.set(message.worker, message);
  renderCards();
  const row = stepRow(message);
  rows.unshift(row);
  $("#sv-steps").prepend(row.el);
  while (rows.length > MAX_ROWS) rows.pop().el.remove();
  rescale();
  $("#sv-skipped").textContent = message.num_skipped
    ? interpolate(ngettext("(%(n)s step between these rows was not sent: the view shows at most 10 a second)",
      "(%(n)s steps between these rows were not sent: the view shows at most 10 a second)", message.num_skipped),
    { n: message.num_skipped.toLocaleString() }) : "";
}

/** Every row's bar on one scale: the longest step shown fills the row. */
function rescale() {
  const scale = Math.max(MIN_SCALE, ...rows.map((r) => r.numTokens));
  for (const row of rows) row.bar.style.width = `${(100 * row.numTokens) / scale}%`;
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
    const seg = h("span", { class: `sv-seg sv-${chunk.kind}`, title }, `#${who}`);
    seg.style.flexGrow = String(chunk.num_tokens);
    bar.append(seg);
  }
  const decodes = step.chunks.filter((c) => c.kind === "decode").length;
  const prefills = step.chunks.length - decodes;
  const summary = [decodes && `${decodes} ${phaseLabel("decode")}`, prefills && `${prefills} ${phaseLabel("prefill")}`].filter(Boolean).join(" · ");
  const preempted = step.preempted_ids.length ? ` · ${interpolate(gettext("preempted %(ids)s"), { ids: `#${step.preempted_ids.join(", #")}` })}` : "";
  const el = h("li", { class: "sv-row" },
    h("span", { class: "sv-meta sv-when mono" },
      `${worker.split("@")[0]} · ${interpolate(gettext("step %(step)s"), { step: step.index })} · ${fmtMs(step.step_ms)}`),
    h("div", { class: "sv-track" }, bar),
    h("span", { class: `sv-meta sv-what mono${preempted ? " sv-preempted" : ""}`,
      title: interpolate(ngettext("%(n)s token ran in this step; the budget is %(budget)s per step",
        "%(n)s tokens ran in this step; the budget is %(budget)s per step", step.num_batched_tokens),
      { n: step.num_batched_tokens, budget: step.token_budget }) },
    `${summary} · ${step.num_batched_tokens}/${step.token_budget} tok${preempted}`));
  return { el, bar, numTokens: step.num_batched_tokens };
}

function describe(step) {
  const decodes = step.chunks.filter((c) => c.kind === "decode").length;
  const prefills = step.chunks.length - decodes;
  return interpolate(gettext("step %(step)s: %(decodes)s decodes, %(prefills)s prefill chunks, %(n)s of %(budget)s tokens"),
    { step: step.index, decodes, prefills, n: step.num_batched_tokens, budget: step.token_budget });
}

function renderCards() {
  if (!workers.size) {
    $("#sv-cards").replaceChildren(h("p", { class: "muted", id: "sv-status" },
      gettext("No worker is running: start one (make run starts one) and its steps show here.")));
    return;
  }
  $("#sv-cards").replaceChildren(...[...workers].map(([name, message]) => (message ? workerCard(message) : idleCard(name))));
}

function idleCard(name) {
  return h("div", { class: "card sv-card sv-idle", dataset: { worker: name } },
    h("div", { class: "sv-card-head" }, h("b", {}, name), h("span", { class: "muted small" }, " ", gettext("idle"))),
    h("p", { class: "muted small" }, gettext("Up and waiting for requests: send a message in the chat (or several at once) "
      + "and its steps appear here.")));
}

function workerCard({ worker, step }) {
  const b = step.blocks;
  const pct = (n) => `${Math.round((100 * n) / Math.max(b.num_blocks, 1))}%`;
  const kv = h("div", { class: "sv-kv", title: gettext("KV blocks: used by running requests | cached (free, kept by prefix hash) | empty") });
  for (const [cls, n] of [["sv-used", b.num_used_blocks], ["sv-cached", b.num_cached_free_blocks],
    ["sv-empty", b.num_free_blocks - b.num_cached_free_blocks]]) {
    const seg = h("span", { class: cls });
    seg.style.width = pct(n);
    kv.append(seg);
  }
  return h("div", { class: "card sv-card", dataset: { worker } },
    h("div", { class: "sv-card-head" }, h("b", {}, worker), h("span", { class: "muted small" }, " ", interpolate(gettext("step %(step)s"), { step: step.index }))),
    h("div", { class: "sv-numbers" },
      number(gettext("running"), step.num_running, gettext("requests in the batch")),
      number(gettext("waiting"), step.num_waiting, gettext("requests waiting for a place in the batch")),
      number(gettext("tokens"), `${step.num_batched_tokens}/${step.token_budget}`, gettext("tokens in this step / the step's budget")),
      number(gettext("step"), fmtMs(step.step_ms), gettext("time of this step: one forward pass for everyone, plus sampling")),
      number(gettext("preempted"), step.num_preemptions, gettext("requests preempted since the worker started (out of KV blocks)")),
      number(gettext("prefix hits"), `${Math.round(100 * (b.hit_rate ?? 0))}%`, gettext("prompt tokens served from shared blocks, over all prompt tokens"))),
    h("div", { class: "small muted" },
      interpolate(gettext("KV blocks (%(size)s tokens each): %(used)s used, %(shared)s shared, %(cached)s cached, %(empty)s empty of %(n)s"),
        { size: b.block_size, used: b.num_used_blocks, shared: b.num_shared_blocks, cached: b.num_cached_free_blocks,
          empty: b.num_free_blocks - b.num_cached_free_blocks, n: b.num_blocks })),
    kv);
}

function number(label, value, title) {
  return h("div", { class: "sv-number", title }, h("span", { class: "sv-value" }, String(value)), h("span", { class: "sv-label" }, label));
}

connect();
