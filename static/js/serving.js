// How one generation was served, for both pages. Owns: the prefill/decode handoff as a
// timeline bar (docs/pd-disaggregation.md), the "colocated on <worker>" line, and the
// worker's prefix-cache counters (docs/prefix-cache.md). Pure DOM builders: must not know
// sockets or page state; callers pass the event/stats fields in.
import { h } from "./dom.js";
import { fmtBytes, fmtMs, phaseLabel } from "./format.js";
import { gettext, interpolate } from "./i18n.js";

// The five phases of a disaggregated request, between `timeline` marks (epoch ms).
const SEGMENTS = [
  { key: "prefill", from: "prefill_start", to: "prefill_end", name: phaseLabel("prefill"),
    why: gettext("the prompt in one forward pass, and the first token") },
  { key: "store", from: "prefill_end", to: "handoff_stored", name: gettext("serialize + store"),
    why: gettext("the prefill worker serializes the KV cache and stores it for the decode worker") },
  { key: "wait", from: "handoff_stored", to: "decode_start", name: gettext("waiting"),
    why: gettext("the stored KV cache waits in the queue for a free decode worker") },
  { key: "load", from: "decode_start", to: "kv_loaded", name: gettext("fetch + load"),
    why: gettext("the decode worker fetches the KV cache, verifies it and loads it") },
  { key: "decode", from: "kv_loaded", to: "decode_end", name: phaseLabel("decode"),
    why: gettext("one token per forward pass on the decode worker") },
];

/** Whether stats / a handoff event describe a disaggregated run. */
export const isDisaggregated = (info) => Boolean(info?.prefill_worker && info?.timeline);

/**
 * Each segment's duration in ms; a negative one (the two workers' clocks disagree) is 0.
 * `liveDecodeMs` stands in for the decode segment until `timeline.decode_end` is known.
 */
export function timelineSegments(timeline, liveDecodeMs = 0) {
  const at = { ...timeline };
  if (at.decode_end == null && at.kv_loaded != null) at.decode_end = at.kv_loaded + liveDecodeMs;
  return SEGMENTS.map((segment) => {
    const start = at[segment.from];
    const end = at[segment.to];
    const ms = start == null || end == null ? 0 : Math.max(0, end - start);
    return { ...segment, ms };
  });
}

/**
 * The handoff timeline of one PD generation: a bar with a segment per phase, then a
 * legend that names the workers. `info` is a `generation.handoff` event or finished stats.
 */
export function pdTimeline(info, liveDecodeMs = 0) {
  const segments = timelineSegments(info.timeline, liveDecodeMs);
  const totalMs = segments.reduce((sum, s) => sum + s.ms, 0) || 1;
  const isLive = info.timeline.decode_end == null;
  // The decode worker's claim-to-loaded time beyond fetch + load (e.g. loading its model first).
  const otherMs = segments.find((s) => s.key === "load").ms - (info.fetch_ms ?? 0) - (info.load_ms ?? 0);
  const detail = {
    prefill: info.prefill_worker,
    store: `${fmtBytes(info.kv_transfer_bytes)} KV`,
    wait: null,
    load: interpolate(gettext("fetch %(fetch)s · load %(load)s"), { fetch: fmtMs(info.fetch_ms), load: fmtMs(info.load_ms) })
      + (otherMs >= 50 ? ` · ${interpolate(gettext("other %(time)s"), { time: fmtMs(otherMs) })}` : ""),
    decode: isLive ? `${info.decode_worker} · ${gettext("streaming…")}` : info.decode_worker,
  };
  const title = (s) => `${s.name}: ${fmtMs(s.ms)} (${s.why})`;
  const bar = h("div", { class: "pd-bar", role: "img",
    "aria-label": segments.map((s) => `${s.name} ${fmtMs(s.ms)}`).join(", ") },
  segments.map((s) => h("span", { class: `pd-seg pd-${s.key}`, title: title(s),
    style: `flex-grow: ${s.ms / totalMs}` })));
  const legend = h("div", { class: "pd-legend" }, segments.map((s) => h("span", { class: `pd-item pd-item-${s.key}`, title: title(s) },
    h("span", { class: `swatch pd-${s.key}` }), h("b", {}, s.name), ` ${fmtMs(s.ms)}`,
    detail[s.key] ? h("span", { class: "muted" }, ` · ${detail[s.key]}`) : null)));
  return h("div", { class: `pd-timeline${isLive ? " live" : ""}` },
    h("div", { class: "serving-head" }, h("span", { class: "badge pd-badge" }, "PD"),
      h("span", {}, gettext("prefill on"), " ", h("b", { class: "mono" }, info.prefill_worker), " → ", gettext("decode on"), " ",
        h("b", { class: "mono" }, info.decode_worker)),
      h("span", { class: "muted" }, " · ", interpolate(gettext("KV handoff %(bytes)s"), { bytes: fmtBytes(info.kv_transfer_bytes) }))),
    bar, legend);
}

/** A generation that one worker ran whole. */
export function colocatedLine(worker) {
  return h("div", { class: "serving-head colocated", title: gettext("one worker ran both the prefill and the decode") },
    gettext("colocated on"), " ", h("b", { class: "mono" }, worker));
}

/** The worker's prefix-cache counters after the request (stats.prefix_cache). */
export function prefixCacheLine(counters) {
  const num = (value) => (value ?? 0).toLocaleString();
  const rate = counters.hit_rate == null ? "–" : `${Math.round(counters.hit_rate * 100)}%`;
  const parts = [
    [interpolate(gettext("%(hits)s hits / %(misses)s misses (%(rate)s)"), { hits: num(counters.hits), misses: num(counters.misses), rate }),
      gettext("lookups that reused a cached prefix, over all lookups")],
    [interpolate(gettext("%(n)s tokens held"), { n: num(counters.num_stored_tokens) }), gettext("tokens whose KV the cache holds now")],
    [`${fmtBytes(counters.num_bytes)} / ${fmtBytes(counters.max_bytes)}`, gettext("memory used / the cache's budget")],
    // num_entries: the name a generation saved before the prefix cache's counters were renamed.
    [interpolate(gettext("%(n)s blocks"), { n: num(counters.num_stored_blocks ?? counters.num_entries) }), gettext("full KV blocks kept by hash, shared by requests with the same prefix")],
    [interpolate(gettext("%(n)s evicted"), { n: num(counters.num_evictions) }), gettext("cached blocks reused for other tokens (least recently freed first)")],
  ];
  if (counters.sliding_window) {
    parts.push([interpolate(gettext("%(n)s not cached (sliding window %(window)s)"), { n: num(counters.num_not_cached_sliding_window), window: counters.sliding_window }),
      gettext("this model attends to its last tokens only, so its cache forgets older positions: a conversation longer than the window cannot be reused as a prefix")]);
  }
  if (counters.num_cached_tokens != null) {
    parts.push([interpolate(gettext("%(n)s reused"), { n: num(counters.num_cached_tokens) }), gettext("prompt tokens served from the cache since the worker started")]);
  }
  return h("div", { class: "prefix-cache", title: gettext("this worker's prefix cache after the request (docs/prefix-cache.md)") },
    h("span", { class: "serving-label" }, gettext("worker prefix cache")),
    parts.map(([text, title]) => h("span", { class: "pc-item", title }, text)));
}

/**
 * Everything above for one generation: the timeline (from finished stats, or a handoff
 * event while it streams), else the colocated line; then the prefix-cache counters.
 */
export function servingView({ stats = null, handoff = null, liveDecodeMs = 0 }) {
  const pd = isDisaggregated(stats) ? stats : handoff;
  return [
    pd ? pdTimeline(pd, liveDecodeMs) : stats?.worker ? colocatedLine(stats.worker) : null,
    stats?.prefix_cache ? prefixCacheLine(stats.prefix_cache) : null,
  ].filter(Boolean);
}
