"""The roofline view's numbers: the device's measured limits, and the FLOPs, bytes and
arithmetic intensity of prefill and decode on the bundled model's config, against hand counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inference.introspect import architecture as arch
from inference.introspect.device_limits import DeviceLimits, device_limits, measured_limits
from inference.introspect.roofline import roofline
from inference.introspect.timeline import timeline

# SmolLM2-135M by hand: 30 layers of q (576 x 576), k and v (576 x 3 KV heads x 64), o (576 x 576),
# a SwiGLU MLP (3 x 576 x 1536), and the tied 49,152 x 576 table used again as the LM head.
LAYER = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536
HEAD = 49152 * 576
MATMUL = 30 * LAYER + HEAD  # weights multiplied per token (2 FLOPs each)
PER_KEY = 30 * 2 * 9 * (64 + 64)  # one query against one cached key and value, 9 heads, all layers
TOTAL = 134_515_008  # parameters (norms included), each read once per forward pass
KV_VALUES = 30 * 2 * 3 * 64  # values cached per token


@pytest.fixture(scope="module")
def shape(bundled_model_dir: Path) -> arch.Shape:
    return arch.shape_from_config(json.loads((bundled_model_dir / "config.json").read_text()))


def limits(flops: float = 1e11, bandwidth: float = 1e10) -> DeviceLimits:
    return DeviceLimits("cpu", "float32", flops, bandwidth, matmul_size=1024, copy_bytes=1 << 28, measure_ms=1.0)


def test_the_device_is_measured_once_with_sane_numbers() -> None:
    first = device_limits("cpu", torch.float32)
    assert 1e8 < first.matmul_flops_per_s < 1e15  # a slow core to a big server
    assert 1e8 < first.memory_bytes_per_s < 1e13
    assert first.ridge == first.matmul_flops_per_s / first.memory_bytes_per_s
    assert first.matmul_size >= 256 and first.copy_bytes == 256 << 20
    assert device_limits(torch.device("cpu"), torch.float32) is first  # cached: not measured again
    assert measured_limits("cpu", torch.float32) is first
    assert first.to_dict()["ridge"] == first.ridge


def test_the_roof_is_bandwidth_then_peak() -> None:
    device = limits(flops=1e11, bandwidth=1e10)
    assert device.ridge == 10
    assert device.roof(2) == 2e10  # memory-bound: 2 FLOP per byte x 10 GB/s
    assert device.roof(50) == 1e11  # compute-bound: the matmul peak


def test_prefill_flops_count_the_engines_work(shape: arch.Shape) -> None:
    assert arch.matmul_parameters(shape) == MATMUL
    assert arch.attention_flops_per_key(shape) == PER_KEY
    # 20 positions, each attending to itself and those before it; logits of the last one only
    assert arch.prefill_flops(shape, 20, logits=1) == 2 * MATMUL * 20 - 2 * HEAD * 19 + PER_KEY * 210
    # 15 of them from the prefix cache: 5 computed, attending to 16..20 positions
    assert arch.prefill_flops(shape, 20, cached=15, logits=1) == 2 * MATMUL * 5 - 2 * HEAD * 4 + PER_KEY * 90
    assert arch.prefill_flops(shape, 20) == 2 * MATMUL * 20 + PER_KEY * 210  # the card: every position's logits


def test_decode_is_memory_bound_and_prefill_grows_with_the_prompt(shape: arch.Shape) -> None:
    device = limits(flops=1e12, bandwidth=1e11)  # ridge 10 FLOP/byte; both phases below both roofs
    steps = [(k, 10.0) for k in range(1, 9)]  # 8 decode steps of 10 ms
    result = roofline(shape, device, num_prompt=40, num_cached=0, element_bytes=4, prefill_ms=50.0, decode_steps=steps)
    prefill, decode = result["prefill"], result["decode"]
    assert prefill["flops"] == 2 * MATMUL * 40 - 2 * HEAD * 39 + PER_KEY * 40 * 41 // 2
    kv_bytes = KV_VALUES * 4 * 40  # the whole prompt's keys and values, written once
    assert prefill["bytes"] == {"weights": TOTAL * 4, "kv_cache": kv_bytes, "total": TOTAL * 4 + kv_bytes}
    contexts = range(41, 49)  # step k reads the token of step k-1: 40 + k positions
    assert decode["flops"] == sum(2 * MATMUL + PER_KEY * c for c in contexts)
    assert decode["bytes"]["total"] == 8 * TOTAL * 4 + KV_VALUES * 4 * sum(contexts)
    assert decode["contexts"] == [41, 48] and decode["ms"] == 80.0
    # fp32 at batch 1: 2 FLOPs per 4-byte weight
    assert 0.45 < decode["intensity"] < 0.55 and decode["bound"] == "memory"
    assert prefill["intensity"] == pytest.approx(prefill["flops"] / prefill["bytes"]["total"])
    assert prefill["intensity"] > device.ridge > decode["intensity"] and prefill["bound"] == "compute"
    assert decode["achieved_flops_per_s"] == pytest.approx(decode["flops"] / 0.080)
    assert decode["achieved_bytes_per_s"] == pytest.approx(decode["bytes"]["total"] / 0.080)
    assert decode["roof_flops_per_s"] == pytest.approx(decode["intensity"] * 1e11)
    assert prefill["roof_flops_per_s"] == 1e12
    assert result["device"]["raised_by"] == {} and result["device"]["matmul_flops_per_s"] == 1e12
    intensities = [
        roofline(shape, device, num_prompt=p, num_cached=0, element_bytes=4, prefill_ms=1.0, decode_steps=[])[
            "prefill"
        ]["intensity"]
        for p in (1, 8, 64, 512)
    ]
    assert intensities == sorted(intensities) and intensities[-1] > 100 * intensities[0]
    assert (
        roofline(shape, device, num_prompt=5, num_cached=0, element_bytes=4, prefill_ms=1.0, decode_steps=[])["decode"]
        is None
    )


def test_a_phase_faster_than_the_measured_roof_raises_it(shape: arch.Shape) -> None:
    """The lesson showed prefill at 147% of its roof: 58.7 GFLOP/s achieved against a 40 GFLOP/s
    peak timed on a 256 x 256 product. What a phase reached is what the device can do: the roof
    is raised to it (and said so), so no point is above its roof."""
    steps = [(k, 20.0) for k in range(1, 9)]
    measured = limits(flops=1e10, bandwidth=1e10)
    prefill_flops = arch.prefill_flops(shape, 40, logits=1)
    prefill_ms = prefill_flops / (1.47 * 1e10) * 1000  # 147% of the measured peak
    result = roofline(
        shape, measured, num_prompt=40, num_cached=0, element_bytes=4, prefill_ms=prefill_ms, decode_steps=steps
    )
    prefill, decode, device = result["prefill"], result["decode"], result["device"]
    assert prefill["achieved_flops_per_s"] == pytest.approx(1.47e10)
    assert device["matmul_flops_per_s"] == prefill["achieved_flops_per_s"]
    assert device["measured_matmul_flops_per_s"] == 1e10
    # decode streamed 8 x 538 MB in 160 ms: 27 GB/s, more than the 10 GB/s measured too
    assert (
        device["memory_bytes_per_s"] == decode["achieved_bytes_per_s"] == pytest.approx(decode["bytes"]["total"] / 0.16)
    )
    assert device["measured_memory_bytes_per_s"] == 1e10
    assert device["raised_by"] == {"matmul_flops_per_s": "prefill", "memory_bytes_per_s": "decode"}
    assert device["ridge"] == pytest.approx(device["matmul_flops_per_s"] / device["memory_bytes_per_s"])
    for point in (prefill, decode):
        assert point["achieved_flops_per_s"] <= point["roof_flops_per_s"] * (1 + 1e-12)
        assert point["fraction_of_roof"] <= 1 + 1e-12
        assert point["bound"] == ("compute" if point["intensity"] >= device["ridge"] else "memory")
    assert prefill["fraction_of_roof"] == pytest.approx(1.0)  # it is the roof now


def test_the_timeline_follows_the_records() -> None:
    steps = [{"index": 0, "phase": "prefill", "latency_ms": 9.0}] + [
        {"index": k, "phase": "decode", "latency_ms": 3.0 + k} for k in (1, 2)
    ]
    colocated = timeline({"queue_ms": 2.0, "prefill_ms": 8.0, "worker": "w"}, steps)
    assert colocated == [
        {"phase": "queue", "ms": 2.0},
        {"phase": "prefill", "ms": 8.0},
        {"phase": "decode", "step": 1, "ms": 4.0},
        {"phase": "decode", "step": 2, "ms": 5.0},
    ]
    marks = {"prefill_start": 1000, "prefill_end": 1008, "handoff_stored": 1010, "decode_start": 1020}
    marks["kv_loaded"] = 1031
    pd = timeline({"queue_ms": 0.0, "prefill_ms": 8.0, "prefill_worker": "p", "timeline": marks}, steps)
    assert [s["phase"] for s in pd] == ["queue", "prefill", "handoff", "decode", "decode"]
    assert pd[2]["ms"] == 23.0
