// The explorer's live mixture-of-experts grids: the routing each step's own forward pass used
// (`step.moe_routing`, streamed with the step), drawn as it arrives with moe_view.js's grids.
// Owns: turning streamed steps into the routing record moe_view.js draws. Must not know: sockets.
import { h } from "./dom.js";
import { moeGrids } from "./moe_view.js";
import { gettext, interpolate, ngettext } from "./i18n.js";

/**
 * Draws into `root` (hidden for a dense model: `model.moe` is null) the steps that carry routing;
 * a step branched in the page has none (no forward pass produced it) and is left out.
 * `promptLastPiece`: the token read before step 0 (the row's hover says what each step read).
 */
export function renderMoeLive(root, model, steps, promptLastPiece) {
  const settings = model?.moe;
  root.hidden = !settings;
  if (!settings) { root.replaceChildren(); return; }
  const tokens = steps.filter((s) => s.moe_routing).map((s) => ({
    step: s.index, sampled_piece: s.piece, layers: s.moe_routing,
    piece: s.index === 0 ? promptLastPiece ?? "" : steps[s.index - 1]?.piece ?? "",
  }));
  const title = h("p", { class: "chart-title" }, gettext("Experts chosen in each step's own forward pass"),
    h("span", { class: "muted small" }, " · ", interpolate(ngettext("%(n)s step, streamed with the tokens", "%(n)s steps, streamed with the tokens", tokens.length), { n: tokens.length })));
  root.replaceChildren(title, ...(tokens.length ? moeGrids({ ...settings, tokens })
    : [h("p", { class: "empty" }, gettext("Run the model to see which experts each step used."))]));
}
