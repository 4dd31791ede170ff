"""`inference.models.memory`: freed heap goes back to the OS when asked (glibc keeps it otherwise),
and the RSS readings it gives."""

from __future__ import annotations

import pytest

from inference.models import memory

glibc_only = pytest.mark.skipif(memory._malloc_trim() is None, reason="malloc_trim is glibc's")


@glibc_only
def test_freed_heap_stays_resident_until_it_is_released() -> None:
    chunks = [bytearray(2048) for _ in range(40_000)]  # 80 MB of malloc chunks (over pymalloc's 512 B)
    for chunk in chunks:
        chunk[::512] = b"x" * 4  # touched: resident
    keep = chunks[-1]  # the heap's top stays in use, so free() alone cannot shrink the heap
    held = memory.rss_mb()
    del chunks
    freed_but_resident = memory.rss_mb()
    assert memory.release_free_memory()
    released = memory.rss_mb()
    assert held - freed_but_resident < 20  # glibc kept (nearly) all of it
    assert freed_but_resident - released > 60  # the trim gave it back
    assert len(keep) == 2048


def test_rss_readings() -> None:
    assert 0 < memory.rss_mb() <= memory.peak_rss_mb()
