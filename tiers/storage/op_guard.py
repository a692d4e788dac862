"""OpGuard: the bookkeeping of a store's operations on one asyncio loop.

Three things every persistent tier needs around its operations:
  * per-key serialisation (``async with guard.key(k)``): writers of one key go one at a time, so
    "the previous object of this key" stays the same from the capacity check to the commit; the
    lock of a key exists only while someone holds or waits for it;
  * shielded operations (``await guard.shielded(coro)``): the operation runs as its own task, so
    a caller's cancellation does not stop it half-way (a write that committed must still free the
    old extent; one that did not must free the new one); its outcome is always retrieved;
  * draining (``await guard.drain()``): waits until no tracked operation is in flight, so a close
    does not pull files and catalog from under running ones (``with guard.track()`` counts one).

Concurrency: loop thread only.
Invariants: ``inflight`` counts tracked and shielded operations not yet finished.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

__all__ = ["OpGuard"]

T = TypeVar("T")


class OpGuard:
    def __init__(self) -> None:
        self.inflight = 0
        self._idle: list[asyncio.Future[None]] = []
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # key -> (lock, [users])

    @contextlib.asynccontextmanager
    async def key(self, key: str) -> AsyncIterator[None]:
        """Hold the lock of ``key``."""
        held = self._locks.get(key)
        if held is None:
            held = self._locks[key] = (asyncio.Lock(), [0])
        lock, users = held
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if not users[0]:
                del self._locks[key]

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count the enclosed operation as in flight."""
        self.inflight += 1
        try:
            yield
        finally:
            self._finished()

    def enter(self) -> None:
        """``track`` for hot paths (a generator context costs ~1.5 us): count one operation in
        flight; the caller must call :meth:`leave` once, in a ``finally``."""
        self.inflight += 1

    def leave(self) -> None:
        """The operation counted by :meth:`enter` is over."""
        self._finished()

    async def shielded(self, operation: Coroutine[Any, Any, T]) -> T:
        """Run ``operation`` to its end even if the caller is cancelled meanwhile."""
        self.inflight += 1
        task = asyncio.ensure_future(operation)
        task.add_done_callback(self._shielded_done)
        return await asyncio.shield(task)

    async def drain(self) -> None:
        """Return once nothing is in flight."""
        while self.inflight:
            waiter = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            await waiter

    def _shielded_done(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: a cancelled caller must not leave it unobserved
        self._finished()

    def _finished(self) -> None:
        self.inflight -= 1
        if not self.inflight:
            for waiter in self._idle:
                if not waiter.done():
                    waiter.set_result(None)
            self._idle.clear()
