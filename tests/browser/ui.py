"""Helpers the browser tests share: reading recorded WebSocket events and poking inputs."""

from __future__ import annotations

from typing import Any


def events(page, event_type: str) -> list[dict[str, Any]]:
    """Every recorded event of `event_type`, oldest first (see conftest.RECORD_EVENTS)."""
    return page.evaluate("(t) => window.__events.filter((e) => e.type === t)", event_type)


def sent_commands(page, command: str) -> list[dict[str, Any]]:
    """Every command of kind `command` the page sent, oldest first (see conftest.RECORD_EVENTS)."""
    return page.evaluate("(c) => window.__sent.filter((m) => m.command === c)", command)


def event_types(page) -> list[str]:
    return page.evaluate("() => window.__events.map((e) => e.type)")


def wait_for_events(page, event_type: str, count: int = 1) -> list[dict[str, Any]]:
    page.wait_for_function(
        "([t, n]) => window.__events.filter((e) => e.type === t).length >= n", arg=[event_type, count]
    )
    return events(page, event_type)


def steps_of_last_generation(page) -> list[dict[str, Any]]:
    """The token steps streamed for the most recent generation."""
    generation_id = events(page, "generation.queued")[-1]["generation_id"]
    return [
        step for e in events(page, "generation.tokens") if e["generation_id"] == generation_id for step in e["steps"]
    ]


def set_range(page, selector: str, value: float) -> None:
    """Move a slider as a user would (Playwright cannot `fill` range inputs)."""
    page.eval_on_selector(
        selector, "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }", value
    )


def chart_data(page, canvas_id: str) -> dict[str, Any]:
    """Labels and dataset values of a Chart.js chart, straight from Chart.js."""
    return page.evaluate(
        """(id) => {
        const chart = Chart.getChart(document.getElementById(id));
        return {labels: chart.data.labels, datasets: chart.data.datasets.map((d) => ({
            label: d.label, data: d.data, backgroundColor: d.backgroundColor}))};
    }""",
        canvas_id,
    )


def visible_piece(piece: str) -> str:
    """Mirror of static/js/format.js visiblePiece."""
    if piece == "":
        return "∅"
    return piece.replace(" ", "·").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")


def fmt_prob(prob: float) -> str:
    """Mirror of static/js/format.js fmtProb."""
    if 0 < prob < 0.001:
        return "<0.1%"
    return f"{prob * 100:.{0 if prob >= 0.995 or prob == 0 else 1}f}%"


CUT_FINISHES = ("length", "context", "cancelled")  # static/js/format.js: the ends that may cut a character


def shown_text(run: dict[str, Any]) -> tuple[str, bool]:
    """Mirror of static/js/learn_view.js shownText (format.js cutCharacterBytes): a finished run's
    text (of `runs`) less a character its end cut, and whether one was."""
    last = run["steps"][-1] if run["steps"] else {"text_delta": run["finished"]["text"]}  # a beam search: its text
    text = run["finished"]["text"]
    is_cut = (
        run["finished"]["finish_reason"] in CUT_FINISHES
        and (last.get("text_delta") or "").endswith("\ufffd")
        and not (last.get("token_bytes") or "").lower().endswith("efbfbd")
    )
    return (text.rstrip("\ufffd"), True) if is_cut else (text, False)


def runs(page) -> list[dict[str, Any]]:
    """Every generating command the page sent, oldest first, with the events that answered it:
    {"command", "queued", "started", "prefilled", "steps", "finished", "error"} (None or [] when
    absent). Matched by the command's request_id, then by its generation id."""
    recorded = page.evaluate("() => ({sent: window.__sent, events: window.__events})")
    by_generation: dict[int, list[dict[str, Any]]] = {}
    queued_by_request: dict[str, dict[str, Any]] = {}
    errors_by_request: dict[str, dict[str, Any]] = {}
    for event in recorded["events"]:
        if event.get("type") == "generation.queued":
            queued_by_request[event["request_id"]] = event
        elif event.get("type") == "error" and event.get("request_id"):
            errors_by_request[event["request_id"]] = event
        if "generation_id" in event:
            by_generation.setdefault(event["generation_id"], []).append(event)
    result = []
    for command in recorded["sent"]:
        if command.get("command") not in ("generate", "regenerate", "edit", "complete"):
            continue
        queued = queued_by_request.get(command.get("request_id"))
        own = by_generation.get(queued["generation_id"], []) if queued else []

        def first(kind: str, own: list[dict[str, Any]] = own) -> dict[str, Any] | None:
            return next((e for e in own if e["type"] == kind), None)

        result.append(
            {
                "command": command,
                "queued": queued,
                "started": first("generation.started"),
                "prefilled": first("generation.prefilled"),
                "steps": [step for e in own if e["type"] == "generation.tokens" for step in e["steps"]],
                "finished": first("generation.finished"),
                "error": first("generation.error") or errors_by_request.get(command.get("request_id")),
            }
        )
    return result


# The innermost elements that reach past the right edge of the window (what makes a page scroll
# sideways), each as "tag#id.class: its right edge, its scroll width" (at most 10).
_OVERFLOWING = """(root) => {
  const describe = (e) => e.tagName.toLowerCase() + (e.id ? `#${e.id}` : "")
    + [...e.classList].map((c) => `.${c}`).join("");
  const past = [...document.querySelectorAll(`${root}, ${root} *`)].filter((e) => {
    const box = e.getBoundingClientRect();
    return box.width > 0 && box.right > innerWidth + 0.5;
  });
  return past.filter((e) => !past.some((other) => other !== e && e.contains(other))).slice(0, 10)
    .map((e) => `${describe(e)}: right ${Math.round(e.getBoundingClientRect().right)}, scrollWidth ${e.scrollWidth}`);
}"""


def overflowing(page, root: str = "body") -> list[str]:
    """The innermost elements under `root` that reach past the window's right edge."""
    return page.evaluate(_OVERFLOWING, root)
