"""The roofline of one finished generation: where its prefill and its decode sat under the
device's two roofs, and why one is compute-bound and the other memory-bound.

Owns: for each phase, the FLOPs (architecture.py's `prefill_flops` / `decode_flops`, from the
model's shapes and the request's real token counts and context lengths, attention's context
term included), the bytes moved (`decode_bytes_read`: every weight once per forward pass plus
the KV cache read), their ratio (arithmetic intensity, FLOP/byte), what the measured time
achieved (FLOP/s, bytes/s) and the roof at that intensity, min(peak FLOP/s, intensity x
bandwidth). Counts are for the request as if it ran alone (batch 1): a batch shares each
weight read among its requests. The roofs are the device's measured ones, raised to what a phase
of the request itself reached when it beat them (`roofs`): no point is ever drawn above its roof.
Must not know: torch, how requests are stored, Django.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from inference.introspect.architecture import Shape, decode_bytes_read, decode_flops, prefill_flops

if TYPE_CHECKING:
    from inference.introspect.device_limits import DeviceLimits


def phase_point(flops: int, weights: int, kv_cache: int, ms: float, limits: DeviceLimits) -> dict[str, Any]:
    """One phase on the roofline: its intensity, what it achieved in `ms`, the roof above it."""
    total = weights + kv_cache
    intensity = flops / total
    seconds = ms / 1000
    achieved = flops / seconds if seconds > 0 else None
    roof = limits.roof(intensity)
    return {
        "flops": flops,
        "bytes": {"weights": weights, "kv_cache": kv_cache, "total": total},
        "intensity": intensity,
        "ms": ms,
        "achieved_flops_per_s": achieved,
        "achieved_bytes_per_s": total / seconds if seconds > 0 else None,
        "roof_flops_per_s": roof,
        "fraction_of_roof": achieved / roof if achieved is not None else None,
        "bound": "compute" if intensity >= limits.ridge else "memory",
    }


def prefill_point(
    s: Shape, num_prompt: int, num_cached: int, element_bytes: int, ms: float, limits: DeviceLimits
) -> dict[str, Any]:
    """The prompt's one forward pass: every computed position multiplies every weight (read once),
    attends to the positions before it; logits for the last position only (what the engine samples)."""
    flops = prefill_flops(s, num_prompt, cached=num_cached, logits=1)
    read = decode_bytes_read(s, num_prompt, element_bytes, element_bytes)  # weights once + the prompt's KV
    point = phase_point(flops, read["weights"], read["kv_cache"], ms, limits)
    return {**point, "num_tokens": num_prompt - num_cached, "num_cached_tokens": num_cached, "num_passes": 1}


def decode_point(
    s: Shape, num_prompt: int, steps: Sequence[tuple[int, float]], element_bytes: int, limits: DeviceLimits
) -> dict[str, Any] | None:
    """Every decode step together; `steps` are (step index, ms). Step k reads the token of step
    k-1, so `num_prompt + k` positions are in the cache (itself included); None without one."""
    if not steps:
        return None
    contexts = [num_prompt + index for index, _ in steps]
    flops = sum(decode_flops(s, context)["as_run"] for context in contexts)
    reads = [decode_bytes_read(s, context, element_bytes, element_bytes) for context in contexts]
    weights, kv_cache = sum(r["weights"] for r in reads), sum(r["kv_cache"] for r in reads)
    point = phase_point(flops, weights, kv_cache, sum(ms for _, ms in steps), limits)
    return {**point, "num_tokens": len(steps), "num_passes": len(steps), "contexts": [contexts[0], contexts[-1]]}


def roofline(
    s: Shape,
    limits: DeviceLimits,
    *,
    num_prompt: int,
    num_cached: int,
    element_bytes: int,
    prefill_ms: float,
    decode_steps: Sequence[tuple[int, float]],
) -> dict[str, Any]:
    """The device's roofs and both phases of one generation."""

    def place(under: DeviceLimits) -> dict[str, dict[str, Any] | None]:
        return {
            "prefill": prefill_point(s, num_prompt, num_cached, element_bytes, prefill_ms, under),
            "decode": decode_point(s, num_prompt, decode_steps, element_bytes, under),
        }

    points = place(limits)
    roof, raised_by = roofs(limits, points)
    if raised_by:  # the bounds and shares change with the roofs: placed again under the raised ones
        points = place(roof)
    device = roof.to_dict() | {
        "measured_matmul_flops_per_s": limits.matmul_flops_per_s,
        "measured_memory_bytes_per_s": limits.memory_bytes_per_s,
        "raised_by": raised_by,
    }
    return {"device": device, "element_bytes": element_bytes, **points}


def roofs(limits: DeviceLimits, points: dict[str, dict[str, Any] | None]) -> tuple[DeviceLimits, dict[str, str]]:
    """The roofs to draw: each measured one, or what a phase reached when that was more (then
    `raised_by` names the phase per roof). A kernel that beat the timed product shows the device
    can do more than measured (a 256 x 256 product timed 40 GFLOP/s on a busy CPU where the
    prefill's larger products reached 58.7: "147% of the roof"); the roof is the best known."""
    flops, bandwidth = limits.matmul_flops_per_s, limits.memory_bytes_per_s
    raised_by: dict[str, str] = {}
    for phase, point in points.items():
        if point is None or point["achieved_flops_per_s"] is None:
            continue
        if point["achieved_flops_per_s"] > flops:
            flops, raised_by["matmul_flops_per_s"] = point["achieved_flops_per_s"], phase
        if point["achieved_bytes_per_s"] > bandwidth:
            bandwidth, raised_by["memory_bytes_per_s"] = point["achieved_bytes_per_s"], phase
    return replace(limits, matmul_flops_per_s=flops, memory_bytes_per_s=bandwidth), raised_by
