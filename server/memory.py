"""The service's C heap: big temporaries mapped on their own, and the allocator's figures in
``/metrics``.

    settle_allocator()          # once, when the service starts (the app's lifespan)
    async with trimming_heap(every_s=10.0): ...   # while it serves
    malloc_bytes()              # {"in_use": ..., "free": ..., "mmapped": ...} or {}

Why: a search batch's scratch (distance matrices, head-scan partial sorts, top-k arrays) and an
upsert's matrix are numpy arrays of a few hundred KiB to tens of MiB, made on the loop thread,
the index's scoring thread and worker threads. glibc serves blocks from 128 KiB up with a
mapping of their own only until the first such block is freed: it then raises its mmap
threshold to that block's size (up to 32 MiB), and later big arrays come from its per-thread
heaps, where freed memory stays. Measured under the load benchmark's soak (90/10 query/upsert at
concurrency 8, debian-minilm, ``python -m benchmarks.server.memory_probe``): bytes in use by
the C allocator stayed flat (+0.5%), Python's objects and blocks flat, while the heaps' free
bytes grew 123 -> 145 MiB in 80 s and were most of RssAnon's growth. With the threshold fixed
at 1 MiB (``tiers.io.cap_heap_retention``: such blocks are unmapped when freed) the heaps held
6 MiB free and did not grow. The price is a fresh mapping (page faults) per big array.

Below the threshold, blocks freed in the middle of a heap stay there as well (glibc returns only
a heap's free top on its own): under the soak with new points (``memory_probe`` without
``--overwrite``, 150 s) the heaps' free bytes grew 5.4 -> 11.6 MiB while bytes in use grew
0.9 MiB. ``trimming_heap`` asks glibc every ``every_s`` (``malloc_trim(0)``, ~1 ms, on a
thread of its own) to give the free pages of every heap back.

An operator's own ``MALLOC_MMAP_THRESHOLD_`` (glibc's tunable) is left as it is. Where the C
library is not glibc both calls do nothing. Thread-safety: any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
import os
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tiers.io import cap_heap_retention, trim_heap

__all__ = [
    "MMAP_THRESHOLD_BYTES",
    "TRIM_EVERY_S",
    "MallocCollector",
    "malloc_bytes",
    "settle_allocator",
    "trimming_heap",
]

MMAP_THRESHOLD_BYTES = 1 << 20
TRIM_EVERY_S = 10.0


def settle_allocator() -> bool:
    """Blocks from ``MMAP_THRESHOLD_BYTES`` up mapped on their own, process-wide; True where
    the setting was made here (False: not glibc, or the operator set it)."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_"):
        return False
    return cap_heap_retention(MMAP_THRESHOLD_BYTES)


@contextlib.asynccontextmanager
async def trimming_heap(every_s: float = TRIM_EVERY_S) -> AsyncIterator[None]:
    """While inside, the C heaps' free pages go back to the OS every ``every_s`` (0: never).
    A thread of its own does it, not a timer on the loop: a pending timer at the head of the
    loop's queue keeps the cancelled request timeouts behind it alive until asyncio purges
    them in bulk (the leak test counted 70 of them)."""
    if every_s <= 0 or not trim_heap():  # not glibc: nothing to ask
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            trim_heap()

    thread = threading.Thread(target=loop, name="tierkit-heap-trim", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Any | None:
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc < 2.33
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


def malloc_bytes() -> dict[str, int]:
    """The C allocator over all its heaps: bytes handed out and not freed (``in_use``), bytes
    freed but kept in its heaps (``free``), bytes in blocks mapped on their own (``mmapped``).
    Empty where the C library cannot say."""
    function = _mallinfo2()
    if function is None:
        return {}
    info = function()
    return {"in_use": info.uordblks, "free": info.fordblks, "mmapped": info.hblkhd}


class MallocCollector(Collector):
    """``tierkit_malloc_{in_use,free,mmapped}_bytes`` gauges, read when scraped."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, value in malloc_bytes().items():
            yield GaugeMetricFamily(
                f"tierkit_malloc_{name}_bytes", f"C allocator: {name} bytes", value=value
            )
