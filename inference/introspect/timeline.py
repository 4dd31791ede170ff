"""The timeline of one finished generation: queue, prefill, the prefill/decode hand-over (when
disaggregated), then each decode step, with the milliseconds the engine recorded.

Owns: turning the finished stats (`Finished.to_dict()` plus the PD hand-over fields and marks,
docs/pd-disaggregation.md) and the step records into ordered segments. Must not know: torch,
Django, how the records are stored.
"""

from __future__ import annotations

from typing import Any


def timeline(stats: dict[str, Any], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Segments in order, each {"phase", "ms"} (decode steps add "step"): queue (arrival to first
    scheduled), prefill (the prompt's forward pass), handoff (PD: prefill end to the KV loaded
    on the decode worker), decode (each step: its forward pass and the token's draw)."""
    segments = [
        {"phase": "queue", "ms": float(stats.get("queue_ms") or 0.0)},
        {"phase": "prefill", "ms": float(stats.get("prefill_ms") or 0.0)},
    ]
    handoff = handoff_ms(stats)
    if handoff is not None:
        segments.append({"phase": "handoff", "ms": handoff})
    segments += [
        {"phase": "decode", "step": step["index"], "ms": float(step["latency_ms"])}
        for step in steps
        if step.get("phase") == "decode"
    ]
    return segments


def handoff_ms(stats: dict[str, Any]) -> float | None:
    """Prefill end to KV loaded on the decode worker (serialize, store, wait, fetch, load); None
    when one worker ran the whole request. A negative span (two clocks disagree) is 0."""
    marks = stats.get("timeline") or {}
    if not stats.get("prefill_worker") or marks.get("prefill_end") is None or marks.get("kv_loaded") is None:
        return None
    return max(0.0, float(marks["kv_loaded"] - marks["prefill_end"]))
