"""AlignedBufferPool: fixed-size, page-aligned buffers carved from one arena and reused.

One anonymous ``mmap`` holds ``count`` buffers of ``buffer_size_bytes`` each, so every buffer is
aligned for O_DIRECT and the whole arena can be registered with io_uring in one call
(:meth:`tiers.io.uring.engine.UringEngine.register_buffers`). Nothing is allocated per I/O.

Concurrency: ``try_acquire``/``release`` are thread-safe. ``acquire`` waits on the running
asyncio loop; a buffer released from another thread wakes waiters through that loop.
Invariants: a buffer is either free or held by exactly one caller; ``release`` of a buffer that
is not held raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import threading
from collections import deque

import numpy as np

from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.errors import EngineClosedError, InvalidArgumentError

__all__ = ["AlignedBufferPool", "PooledBuffer"]


class PooledBuffer:
    """One buffer of the pool. ``array`` is a writable uint8 numpy view; release it when done."""

    __slots__ = ("_pool", "array", "index")

    def __init__(self, pool: AlignedBufferPool, index: int, array: np.ndarray) -> None:
        self._pool = pool
        self.index = index
        self.array = array

    def release(self) -> None:
        self._pool.release(self)

    def __enter__(self) -> PooledBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class AlignedBufferPool:
    """``count`` reusable buffers of ``buffer_size_bytes`` (a multiple of ``alignment_bytes``)."""

    def __init__(
        self, buffer_size_bytes: int, count: int, alignment_bytes: int = PAGE_SIZE_BYTES
    ) -> None:
        if count <= 0 or buffer_size_bytes <= 0:
            raise InvalidArgumentError("pool needs a positive buffer size and count")
        if alignment_bytes % PAGE_SIZE_BYTES and PAGE_SIZE_BYTES % alignment_bytes:
            raise InvalidArgumentError(f"alignment {alignment_bytes} must divide the page size")
        if buffer_size_bytes % alignment_bytes:
            raise InvalidArgumentError(
                f"buffer size {buffer_size_bytes} is not a multiple of {alignment_bytes}"
            )
        self.buffer_size_bytes = buffer_size_bytes
        self.count = count
        self._mmap = mmap.mmap(-1, buffer_size_bytes * count)
        self.arena = np.frombuffer(self._mmap, dtype=np.uint8)
        self._buffers = [
            PooledBuffer(self, i, self.arena[i * buffer_size_bytes : (i + 1) * buffer_size_bytes])
            for i in range(count)
        ]
        self._free: deque[int] = deque(range(count))
        self._held = [False] * count
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self._closed = False

    @property
    def free_count(self) -> int:
        return len(self._free)

    def try_acquire(self) -> PooledBuffer | None:
        """A free buffer, or None when all are held."""
        with self._lock:
            if self._closed:
                raise EngineClosedError("buffer pool is closed")
            if not self._free:
                return None
            index = self._free.popleft()
            self._held[index] = True
            return self._buffers[index]

    async def acquire(self) -> PooledBuffer:
        """A free buffer, waiting (without blocking the loop) until one is released."""
        while True:
            buffer = self.try_acquire()
            if buffer is not None:
                return buffer
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            with self._lock:
                if self._free:
                    continue
                self._waiters.append((loop, waiter))
            await waiter

    def release(self, buffer: PooledBuffer) -> None:
        with self._lock:
            if buffer._pool is not self or not self._held[buffer.index]:
                raise InvalidArgumentError("release of a buffer this pool does not hold")
            self._held[buffer.index] = False
            self._free.append(buffer.index)
            # Wake every waiter: one of them may have been cancelled, and the losers re-wait.
            waiters = list(self._waiters)
            self._waiters.clear()
        for loop, future in waiters:
            loop.call_soon_threadsafe(_wake, future)

    def close(self) -> None:
        """Free the arena. Requires: no buffer is held and no I/O targets the arena."""
        with self._lock:
            if self._closed:
                return
            if any(self._held):
                raise InvalidArgumentError("close of a pool whose buffers are still held")
            self._closed = True
        del self._buffers, self.arena
        # A caller may still hold a view of the arena: then its memory goes when the view does.
        with contextlib.suppress(BufferError):
            self._mmap.close()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
