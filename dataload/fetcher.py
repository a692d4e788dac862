"""Fetcher: one background thread running one asyncio loop that owns the I/O engine and source.

The training loop (any other thread) calls :meth:`Fetcher.submit` with a batch's indices and gets
a ``concurrent.futures.Future``. Every submitted batch becomes a task on the loop; the tasks'
reads go to the engine together (io_uring: batches started in one loop iteration share one
submission) and complete in any order, so while the consumer works on batch k, the reads of
batches k+1 .. k+prefetch are all in flight. Assembly with per-sample Python (a transform, a
collate_fn) runs in a pool of decode threads, so the loop keeps the device busy meanwhile -- or,
with ``decode_threads=0``, in the consumer's thread when it takes the batch (``complete``).

Concurrency: ``submit`` and ``close`` are thread-safe; everything else runs on the loop thread.
Invariants: after ``close`` returns, the thread has exited, every file and the engine are closed,
and the decode pool is shut down. ``close`` never hangs on an abandoned batch: unfinished tasks
are cancelled (their in-flight reads still finish inside the engine before it closes).
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
from tiers.io import EngineClosedError, IOEngine, create_engine

__all__ = ["Fetcher"]


class Fetcher:
    """Reads and assembles batches of one source in the background."""

    def __init__(
        self,
        source: Source,
        assembler: BatchAssembler,
        *,
        engine: str | Callable[[], IOEngine] = "auto",
        queue_depth: int = 128,
        decode_threads: int = 1,
        max_slabs: int = 16,
        finish: Callable[[Any], Any] | None = None,
    ) -> None:
        self.source = source
        self.assembler = assembler
        self.finish = finish  # e.g. pin_memory, run after assembly on the same thread
        if callable(engine):
            self._make_engine = engine
        else:
            self._make_engine = lambda: create_engine(engine, queue_depth)
        self._inline = decode_threads == 0
        self._decode_threads = max(1, decode_threads)
        self._slabs = SlabPool(max_slabs)
        self._loop = asyncio.new_event_loop()
        self._ready = concurrent.futures.Future()
        self._closed = False
        self._lock = threading.Lock()
        self.engine: IOEngine | None = None
        self._decode = concurrent.futures.ThreadPoolExecutor(
            self._decode_threads, thread_name_prefix="tierkit-decode"
        )
        self._thread = threading.Thread(target=self._run, name="tierkit-loader-io", daemon=True)
        self._thread.start()
        self._ready.result()  # re-raises a failure to create the engine or open the source

    # ----------------------------------------------------------------- loop thread
    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._open())
        except BaseException as exc:
            self._ready.set_exception(exc)
            self._loop.run_until_complete(self._shutdown())
            self._loop.close()
            return
        self._ready.set_result(None)
        self._loop.run_forever()
        self._loop.run_until_complete(self._shutdown())
        self._loop.close()

    async def _open(self) -> None:
        self.engine = self._make_engine()
        await self.source.open(self.engine)

    async def _shutdown(self) -> None:
        tasks = [t for t in asyncio.all_tasks(self._loop) if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self.source.close()
        finally:
            if self.engine is not None:
                await self.engine.aclose()

    async def _fetch(self, indices: np.ndarray) -> Any:
        batch = await self.source.read(indices, self._slabs)
        if self._inline and (self.assembler.heavy or self.finish is not None):
            return _Unassembled(batch)  # assembled by the consumer, in complete()
        if self.assembler.heavy or self.finish is not None:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._decode, self._assemble, batch)
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
            return asyncio.run_coroutine_threadsafe(self._fetch(indices), self._loop)

    def engine_stats(self) -> dict[str, Any]:
        return self.engine.stats() if self.engine is not None else {}

    def close(self, timeout_s: float = 30.0) -> None:
        """Cancel unfinished batches, close source and engine, stop the threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
        self._decode.shutdown(wait=True, cancel_futures=True)
        self._slabs.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class _Unassembled:
    """A batch read but not yet assembled (``decode_threads=0``)."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch
