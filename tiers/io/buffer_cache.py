"""BufferCache: the runtime's one cache of page-aligned buffers, shared by every product.

A thread-safe :class:`~tiers.io.bounce.BounceBuffers`: size classes of eight per doubling from
4 KiB, buffers above ``max_buffer_bytes`` made to measure and never kept, and never more than
``max_cached_bytes`` idle. Products stage O_DIRECT records, read posting pages and assemble
batches in buffers from here instead of keeping caches of their own, so idle staging memory
is bounded once per process.

Thread-safety: ``take``/``give`` may be called from any thread (one lock, held for a list
operation). A buffer belongs to one user between ``take`` and ``give``; a user whose I/O may
still land in a buffer (a cancelled request) must not give it back.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from tiers.io.bounce import BounceBuffers
from tiers.io.buffers import PAGE_SIZE_BYTES, aligned_empty

__all__ = ["BufferCache"]


class BufferCache(BounceBuffers):
    """Aligned uint8 buffers by size class; ``take(n)`` returns one of at least ``n`` bytes."""

    def __init__(
        self,
        max_cached_bytes: int = 64 << 20,
        max_buffer_bytes: int = 16 << 20,
        alignment_bytes: int = PAGE_SIZE_BYTES,
    ) -> None:
        super().__init__(max_cached_bytes, max_buffer_bytes, alignment_bytes)
        self._lock = threading.Lock()

    def take(self, size_bytes: int) -> np.ndarray:
        size = self.class_bytes(size_bytes)
        with self._lock:
            idle = self._free.get(size)
            if idle:
                self.hits += 1
                self.cached_bytes -= size
                return idle.pop()
            self.misses += 1
        return aligned_empty(size, self.alignment_bytes)  # outside the lock: it page-faults

    def give(self, buffer: np.ndarray) -> None:
        with self._lock:
            super().give(buffer)

    def clear(self) -> None:
        with self._lock:
            super().clear()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"cached_bytes": self.cached_bytes, "hits": self.hits, "misses": self.misses}
