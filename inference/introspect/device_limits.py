"""What this process's device can do at best: matmul FLOP/s and memory bandwidth, measured.

Owns: two small timed kernels (a square matmul in the model's dtype, a reduction over a buffer
far larger than any cache) and their one result per (device, dtype) for the life of the process.
A roofline needs both roofs; the vendor's datasheet numbers are not what this machine reaches
with torch, so they are measured, each well under a second on a CPU. Measured lazily (the first
time a view asks, on the engine loop thread so nothing else runs at the same time), never at
import. Must not know: models, requests, Django.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass
from functools import partial

import torch

MATMUL_TARGET_S = 0.05  # stop growing the matrix once one product takes this long
MIN_GAIN = 1.2  # ... or once doubling it raised the rate by less than this
# ... but never below this size: a 256 x 256 product measures call and thread start-up overhead
# (40 GFLOP/s on a busy CPU where the model's prefill reached 58.7), and one slow try at 512 ended
# the search there.
MIN_MATMUL_SIZE = 1024
MAX_MATMUL_SIZE = {"cpu": 2048, "cuda": 8192}
COPY_BYTES = {"cpu": 256 << 20, "cuda": 1 << 30}  # far beyond a CPU's last-level cache or a GPU's L2
REPEATS = 3

_lock = threading.Lock()
_measured: dict[tuple[str, str], DeviceLimits] = {}


@dataclass(frozen=True)
class DeviceLimits:
    """The two roofs of a roofline; `ridge` is where they meet (FLOP per byte)."""

    device: str
    dtype: str
    matmul_flops_per_s: float
    memory_bytes_per_s: float
    matmul_size: int  # n of the n x n x n product timed
    copy_bytes: int  # the buffer the reduction streamed
    measure_ms: float  # both measurements, wall clock

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) above which the matmul roof, not memory, limits."""
        return self.matmul_flops_per_s / self.memory_bytes_per_s

    def roof(self, intensity: float) -> float:
        """The best FLOP/s a kernel of this intensity can reach here: min(peak, intensity x bandwidth)."""
        return min(self.matmul_flops_per_s, intensity * self.memory_bytes_per_s)

    def to_dict(self) -> dict:
        return asdict(self) | {"ridge": self.ridge}


def device_limits(device: torch.device | str, dtype: torch.dtype) -> DeviceLimits:
    """The limits of `device` for `dtype`: measured on the first call, then the same object."""
    key = _key(device, dtype)
    with _lock:  # two callers at once must not time their kernels against each other
        if key not in _measured:
            _measured[key] = _measure(torch.device(device), dtype)
        return _measured[key]


def measured_limits(device: torch.device | str, dtype: torch.dtype) -> DeviceLimits | None:
    """The limits if already measured; never measures (for metrics, which must stay cheap)."""
    return _measured.get(_key(device, dtype))


def _key(device: torch.device | str, dtype: torch.dtype) -> tuple[str, str]:
    return str(torch.device(device)), str(dtype).removeprefix("torch.")


def _measure(device: torch.device, dtype: torch.dtype) -> DeviceLimits:
    t0 = time.perf_counter()
    flops, size = matmul_flops_per_s(device, dtype)
    copy_bytes = COPY_BYTES.get(device.type, COPY_BYTES["cpu"])
    bandwidth = read_bandwidth(copy_bytes, device=device)
    return DeviceLimits(
        device=str(device),
        dtype=str(dtype).removeprefix("torch."),
        matmul_flops_per_s=flops,
        memory_bytes_per_s=bandwidth,
        matmul_size=size,
        copy_bytes=copy_bytes,
        measure_ms=(time.perf_counter() - t0) * 1000,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best_seconds(fn, device: torch.device, repeats: int = REPEATS) -> float:
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return max(best, 1e-9)


@torch.inference_mode()
def matmul_flops_per_s(device: torch.device, dtype: torch.dtype) -> tuple[float, int]:
    """(FLOP/s, n): the best n x n @ n x n product (2 n^3 FLOPs), n doubled from 256 up to at least
    MIN_MATMUL_SIZE, then while the rate still grows and a product stays under MATMUL_TARGET_S
    (small products measure call and thread start-up overhead, not the arithmetic units; large
    ones only cost time)."""
    limit = MAX_MATMUL_SIZE.get(device.type, MAX_MATMUL_SIZE["cpu"])
    n, best, best_n = 256, 0.0, 256
    while True:
        a = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        b = torch.randn(n, n, device=device).to(dtype)  # (n, n)
        seconds = _best_seconds(partial(torch.matmul, a, b), device)
        rate = 2 * n**3 / seconds
        still_growing = rate > best * MIN_GAIN
        if rate > best:
            best, best_n = rate, n
        if (not still_growing and n >= MIN_MATMUL_SIZE) or seconds >= MATMUL_TARGET_S or n >= limit:
            return best, best_n
        n *= 2


@torch.inference_mode()
def read_bandwidth(num_bytes: int, repeats: int = REPEATS, device: torch.device | str = "cpu") -> float:
    """Bytes/s the device streams from memory: the best of `repeats` reductions over `num_bytes`
    (a sum reads each byte once and does one add per 4 bytes: memory, not arithmetic, limits it)."""
    device = torch.device(device)
    x = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)  # written, so pages are resident
    return num_bytes / _best_seconds(lambda: x.sum(), device, repeats)
