"""Fetcher: reads and assembles one source's batches on the runtime's loop thread.

The training loop (any other thread) calls :meth:`Fetcher.submit` with a batch's indices and gets
a ``concurrent.futures.Future``. Every submitted batch becomes a task on the IORuntime's loop;
the tasks' reads go to the loop's one engine together (io_uring: batches started in one loop
iteration share one submission, with those of every other loader and product on that loop) and
complete in any order, so while the consumer works on batch k, the reads of batches
k+1 .. k+prefetch are all in flight. Assembly with per-sample Python (a transform, a collate_fn)
runs on the runtime's CPU executor, at most ``decode_threads`` batches at a time, so the loop
keeps the device busy meanwhile -- or, with ``decode_threads=0``, in the consumer's thread when
it takes the batch (``complete``).

Concurrency: ``submit`` and ``close`` are thread-safe; everything else runs on the loop thread.
Invariants: after ``close`` returns, no task of this fetcher is left on the loop, the source's
files are closed and its engine lease is given back. ``close`` never hangs on an abandoned
batch: unfinished tasks are cancelled (their in-flight reads still finish inside the engine).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from dataload.collate import Assembled, BatchAssembler
from dataload.slabs import SlabPool
from dataload.source import Source
from tiers.io import EngineClosedError, IOEngine, IORuntime

__all__ = ["Fetcher"]


class Fetcher:
    """Reads and assembles batches of one source in the background, on ``runtime``."""

    def __init__(
        self,
        source: Source,
        assembler: BatchAssembler,
        *,
        runtime: IORuntime,
        decode_threads: int = 1,
        max_slabs: int = 16,
        finish: Callable[[Any], Any] | None = None,
    ) -> None:
        self.source = source
        self.assembler = assembler
        self.runtime = runtime
        self.finish = finish  # e.g. pin_memory, run after assembly on the same thread
        self._inline = decode_threads == 0
        self._decode_threads = max(1, decode_threads)
        self._slabs = SlabPool(max_slabs)
        self._loop = runtime.loop
        self._closed = False
        self._lock = threading.Lock()
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self.engine: IOEngine | None = None
        self._decoding: asyncio.Semaphore | None = None
        # re-raises a failure to lease the engine or open the source
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()

    # ----------------------------------------------------------------- loop thread
    async def _open(self) -> None:
        self._decoding = asyncio.Semaphore(self._decode_threads)
        self.engine = self.runtime.acquire_engine()
        try:
            await self.source.open(self.engine)
        except BaseException:
            await self.runtime.release_engine(self.engine)
            raise

    async def _shutdown(self, futures: list[concurrent.futures.Future[Any]]) -> None:
        await asyncio.gather(*(asyncio.wrap_future(f) for f in futures), return_exceptions=True)
        try:
            await self.source.close()
        finally:
            if self.engine is not None:
                await self.runtime.release_engine(self.engine)

    async def _fetch(self, indices: np.ndarray) -> Any:
        batch = await self.source.read(indices, self._slabs)
        if self._inline and (self.assembler.heavy or self.finish is not None):
            return _Unassembled(batch)  # assembled by the consumer, in complete()
        if self.assembler.heavy or self.finish is not None:
            assert self._decoding is not None
            async with self._decoding:
                return await self.runtime.run_cpu(self._assemble, batch)
        return self.assembler(batch)

    def _assemble(self, batch: Any) -> Assembled:
        assembled = self.assembler(batch)
        if self.finish is not None:
            assembled.value = self.finish(assembled.value)
        return assembled

    # ----------------------------------------------------------------- any thread
    def complete(self, result: Any) -> Assembled:
        """The assembled batch of a submitted future's ``result``: with ``decode_threads=0`` the
        transform and collate run here, in the consumer's thread (like DataLoader's
        ``num_workers=0``: no hand-off between threads per batch)."""
        if isinstance(result, _Unassembled):
            return self._assemble(result.batch)
        return result

    def submit(self, indices: np.ndarray) -> concurrent.futures.Future[Assembled]:
        """Start reading and assembling the batch ``indices``; its result comes in the future."""
        with self._lock:
            if self._closed:
                raise EngineClosedError("the loader is closed")
            future = asyncio.run_coroutine_threadsafe(self._fetch(indices), self._loop)
            self._futures.add(future)
        future.add_done_callback(self._forget)
        return future

    def _forget(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._futures.discard(future)

    def engine_stats(self) -> dict[str, Any]:
        return self.engine.stats() if self.engine is not None else {}

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel unfinished batches, close the source, give the engine back. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            futures = list(self._futures)
        for future in futures:
            future.cancel()
        if self._loop.is_closed():
            pass
        elif _running_loop() is self._loop:  # dropped by a callback on the loop: cannot wait
            self._loop.create_task(self._shutdown(futures))
        else:
            done = asyncio.run_coroutine_threadsafe(self._shutdown(futures), self._loop)
            try:
                done.result(timeout_s)
            except concurrent.futures.TimeoutError:
                done.cancel()
        self._slabs.clear()

    @property
    def closed(self) -> bool:
        return self._closed


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class _Unassembled:
    """A batch read but not yet assembled (``decode_threads=0``)."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch
