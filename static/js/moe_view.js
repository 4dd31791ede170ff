// The explorer's mixture-of-experts view: for each MoE layer a grid, one row per step of the
// path, one column per routed expert (groups separated), a cell shaded by the weight the router
// gave that expert for that step; below it how often each expert was chosen (its load).
// Owns: drawing a routing record {settings..., tokens: [{step, piece, sampled_piece, layers}]}:
// the "moe" inspection's answer (docs/inside.md) or one built from streamed steps (moe_live.js).
// Must not know: the request.
import { h } from "./dom.js";
import { fmtNum, visiblePiece } from "./format.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

export const MOE_EXPLAIN = gettext("In a mixture-of-experts layer a small router sends each token to a few of many expert "
  + "networks and mixes their outputs by weight; each row is the step whose token the model wrote, each darker cell "
  + "an expert the router chose to compute it.");

export function renderMoe(r) {
  return h("div", { class: "inside-view", id: "inside-moe" }, moeRule(r), ...moeGrids(r));
}

/** One grid per MoE layer (`r.layers`), rows `r.tokens`. */
export function moeGrids(r) {
  return r.layers.map((layer, i) => layerGrid(r, layer, i));
}

function moeRule(r) {
  const dense = r.first_k_dense_replace;
  return h("p", { class: "small", id: "moe-rule" },
    interpolate(gettext("%(n)s routed experts in %(groups)s groups of %(per)s. For each token the router keeps the %(kept)s strongest groups and picks %(k)s experts inside them; their weights sum to %(scale)s."),
      { n: r.n_routed_experts, groups: r.n_group, per: r.experts_per_group, kept: r.topk_group, k: r.num_experts_per_tok, scale: r.routed_scaling_factor }),
    " ", dense ? interpolate(ngettext("The first layer is dense (no router).", "The first %(n)s layers are dense (no router).", dense), { n: dense }) : "",
    dense ? " " : "", gettext("Grey cells: a group the router did not keep for that step."));
}

function layerGrid(r, layer, index) {
  const per = r.experts_per_group;
  const experts = Array.from({ length: r.n_routed_experts }, (_, e) => e);
  const edge = (e) => (e > 0 && e % per === 0 ? "group-start" : "");
  const load = experts.map(() => 0);
  const rows = r.tokens.map((token) => {
    const choice = token.layers[index];
    const weights = new Map(choice.experts.map((e, j) => [e, choice.weights[j]]));
    for (const e of choice.experts) load[e] += 1;
    const label = interpolate(gettext("step %(step)s “%(piece)s”"), { step: token.step, piece: visiblePiece(token.sampled_piece) });
    return h("tr", { dataset: { step: token.step } },
      h("th", { class: "moe-token", title: interpolate(gettext("step %(step)s: read “%(read)s”, wrote “%(wrote)s”"), { step: token.step, read: token.piece, wrote: token.sampled_piece }) },
        token.step, " ", h("span", { class: "piece" }, visiblePiece(token.sampled_piece))),
      ...experts.map((e) => {
        const w = weights.get(e);
        const off = !choice.groups.includes(Math.floor(e / per));
        return h("td", {
          class: [edge(e), off ? "group-off" : "", w === undefined ? "" : "chosen"].join(" ").trim(),
          style: w === undefined ? null : `--w: ${(w / r.routed_scaling_factor).toFixed(3)}`,
          dataset: w === undefined ? {} : { expert: e, weight: w },
          title: `${label} · ${interpolate(gettext("layer %(layer)s · expert %(expert)s"), { layer: layer + 1, expert: e })}: `
            + (w === undefined ? (off ? gettext("group not kept") : gettext("not chosen")) : interpolate(gettext("weight %(w)s"), { w: fmtNum(w, 3) })),
        });
      }));
  });
  const head = h("tr", {}, h("th", {}, gettext("step")), ...experts.map((e) => h("th", { class: edge(e) }, e)));
  const most = Math.max(1, ...load);
  const foot = h("tr", { class: "moe-load" }, h("th", { title: gettext("how many steps chose each expert") }, gettext("load")),
    ...experts.map((e) => h("td", { class: edge(e), style: `--w: ${(load[e] / most).toFixed(3)}`, dataset: { load: load[e] },
      title: interpolate(gettext("layer %(layer)s · expert %(expert)s: chosen for %(n)s of %(total)s steps"),
        { layer: layer + 1, expert: e, n: load[e], total: r.tokens.length }) }, load[e])));
  const unused = load.filter((n) => n === 0).length;
  return h("div", { class: "moe-layer", dataset: { layer } },
    h("p", { class: "chart-title" }, interpolate(gettext("Layer %(layer)s"), { layer: layer + 1 }),
      h("span", { class: "muted small" }, " · ", interpolate(gettext("%(n)s of %(total)s experts never chosen"), { n: unused, total: r.n_routed_experts }))),
    h("div", { class: "attention-scroll" },
      h("table", { class: "moe-grid" }, h("thead", {}, head), h("tbody", {}, ...rows), h("tfoot", {}, foot))));
}
