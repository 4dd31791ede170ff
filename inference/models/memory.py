"""Giving freed memory back to the operating system, and reading how much this process holds.

Owns: `release_free_memory()` (glibc's `malloc_trim(0)` through ctypes: the pages of freed heap
chunks go back to the OS; a no-op where the C library is not glibc) and `rss_mb()` /
`peak_rss_mb()` (this process's resident memory now and at its peak, from /proc).

Why it is needed: glibc keeps what a process frees. Tensors over its mmap threshold (32 MiB at
most) are unmapped when freed, but everything smaller (a prompt's token records, a 10,000-message
render, a layer's activations for a long prompt, a model's norms and biases) comes from heaps
that shrink only from their top, so one live chunk above a freed gigabyte keeps it resident
until `malloc_trim` walks the heaps and returns every free page inside them.
Must not know: models, requests, Django.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (musl, macOS, a static build): they have no such call."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_free_memory() -> bool:
    """Return the free pages of every malloc heap (all threads' arenas) to the OS; True when
    glibc did release something. Cheap (milliseconds for gigabytes of heap); call it after
    `gc.collect()` once something big was dropped."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False


def rss_mb() -> float:
    """This process's resident memory now, in MiB (the peak where /proc is absent)."""
    return _status_mb("VmRSS") or peak_rss_mb()


def peak_rss_mb() -> float:
    """This process's peak resident memory, in MiB."""
    return _status_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_mb(field: str) -> float:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    return 0.0
