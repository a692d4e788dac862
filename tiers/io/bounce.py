"""BounceBuffers: reusable page-aligned staging buffers for O_DIRECT I/O, kept by size class.

O_DIRECT needs page-aligned memory and whole pages, which a caller's buffer rarely is, so a tier
stages each record in a bounce buffer. Allocating (and page-faulting) a fresh one per request
costs more than a small read itself; this cache hands back buffers of a few size classes
(4 KiB and up, eight per doubling) and keeps returned ones for the next request. Buffers above
``max_buffer_bytes`` are made to measure and never cached (a rare large object must not pin a
large buffer forever), and the cache never holds more than ``max_cached_bytes``.

Concurrency: loop thread only (take/give are plain list operations). A buffer is held by one
request at a time; a request that may still have I/O aimed at its buffer (it was cancelled
mid-flight) must simply not give it back.
Invariants: cached bytes <= ``max_cached_bytes``; every buffer is page-aligned and its size a
multiple of the page size.
"""

from __future__ import annotations

import numpy as np

from tiers.io.buffers import PAGE_SIZE_BYTES, aligned_empty

__all__ = ["BounceBuffers"]


class BounceBuffers:
    """A cache of aligned uint8 buffers. ``take(n)`` returns one of at least ``n`` bytes."""

    def __init__(
        self,
        max_cached_bytes: int = 64 << 20,
        max_buffer_bytes: int = 16 << 20,
        alignment_bytes: int = PAGE_SIZE_BYTES,
    ) -> None:
        self.max_cached_bytes = max_cached_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.alignment_bytes = alignment_bytes
        self.cached_bytes = 0
        self.hits = 0
        self.misses = 0
        self._free: dict[int, list[np.ndarray]] = {}  # class size -> idle buffers

    def class_bytes(self, size_bytes: int) -> int:
        """The size of the buffer ``take(size_bytes)`` returns."""
        unit = self.alignment_bytes
        rounded = max(unit, -(-size_bytes // unit) * unit)
        if rounded > self.max_buffer_bytes:
            return rounded  # made to measure
        # eight classes per doubling: at most 1/8 wasted (a 1 MiB payload's record, 1 MiB +
        # 4 KiB, takes 1.125 MiB, not the 2 MiB of a power-of-two class)
        step = max(unit, 1 << max(0, rounded.bit_length() - 4))
        return -(-rounded // step) * step

    def take(self, size_bytes: int) -> np.ndarray:
        """An aligned buffer of ``class_bytes(size_bytes)`` bytes (contents undefined)."""
        size = self.class_bytes(size_bytes)
        idle = self._free.get(size)
        if idle:
            self.hits += 1
            self.cached_bytes -= size
            return idle.pop()
        self.misses += 1
        return aligned_empty(size, self.alignment_bytes)

    def give(self, buffer: np.ndarray) -> None:
        """Return a buffer from :meth:`take` for reuse (dropped when the cache is full)."""
        size = buffer.nbytes
        if size > self.max_buffer_bytes or self.cached_bytes + size > self.max_cached_bytes:
            return
        self._free.setdefault(size, []).append(buffer)
        self.cached_bytes += size

    def clear(self) -> None:
        self._free.clear()
        self.cached_bytes = 0
