"""ProcessFetcher: the loader's Fetcher when per-sample Python runs in worker processes.

The shape is :class:`~dataload.fetcher.Fetcher`'s (``submit`` -> future of an ``Assembled``,
``complete``, ``close``): reads still go from the runtime's loop to its engine, all batches in
flight at once, but into a :class:`~dataload.workers.shm.ShmSlabPool`; the batch then goes to a
worker as a :class:`~dataload.workers.protocol.Task` that names the slab, and comes back as
tensors that are views of an output slab. Sources whose batches are not in a slab (decoded
columns of Arrow/Parquet, which are pickled with the task) are handled too.

Output slabs are sized from the largest result seen so far (times 1.25); a result that does not
fit comes back pickled once, and the next slabs are big enough.

Concurrency: ``submit``/``close`` from any thread; the rest on the loop.
Invariants: after ``close`` the worker processes are joined, every slab name is unlinked, the
source is closed and the engine lease is given back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dataload.collate import Assembled
from dataload.packed_strings import PackedStrings
from dataload.source import SampleBatch, Source
from dataload.workers.pool import ProcessPool, _on_loop
from dataload.workers.protocol import Task, unpack_tree
from dataload.workers.shm import ShmSlabPool, remove_orphans
from tiers.io import EngineClosedError, IOEngine, IORuntime

__all__ = ["ProcessFetcher"]

_FIRST_OUT_BYTES = 1 << 20


class ProcessFetcher:
    """Reads batches of ``source`` on ``runtime`` and assembles them in ``num_workers``
    processes (``payload``: the pickled ``(assembler, worker_init_fn)`` they run)."""

    def __init__(
        self,
        source: Source,
        payload: bytes,
        *,
        runtime: IORuntime,
        num_workers: int,
        base_seed: int,
        on_error: str = "raise",
        max_slabs: int = 16,
        finish: Callable[[Any], Any] | None = None,
        context: Any = None,
        preload: Sequence[str] = (),
    ) -> None:
        self.source = source
        self.runtime = runtime
        self.on_error = on_error
        self.finish = finish
        self._loop = runtime.loop
        self._slabs = ShmSlabPool(max_slabs)
        self._out_hint_bytes = _FIRST_OUT_BYTES
        self._closed = False
        self._lock = threading.Lock()
        self._futures: set[concurrent.futures.Future[Any]] = set()
        self.engine: IOEngine | None = None
        remove_orphans()
        asyncio.run_coroutine_threadsafe(self._open(), self._loop).result()
        try:
            self.pool = ProcessPool(
                num_workers, payload, base_seed, self._loop, context, preload=preload
            )
        except BaseException:
            self._closed = True
            asyncio.run_coroutine_threadsafe(self._shutdown([]), self._loop).result()
            self._slabs.clear()
            raise

    async def _open(self) -> None:
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

    async def _fetch(self, indices: np.ndarray) -> Assembled:
        batch = await self.source.read(indices, self._slabs)
        if batch.errors and self.on_error == "raise":
            raise batch.errors[min(batch.errors)]
        task = self._task(batch)
        out = self._slabs.acquire(self._out_hint_bytes)
        task.out_ref = (self._slabs.locate(out)[0], len(out))
        done = await self.pool.run(task)  # ``batch`` holds its slab until the worker is done
        del batch
        if done.out_bytes > self._out_hint_bytes:
            self._out_hint_bytes = int(done.out_bytes * 1.25)
        value = unpack_tree(done.spec, out) if done.packed else done.spec
        if self.finish is not None:
            value = await self.runtime.run_cpu(self.finish, value)
        return Assembled(value, done.samples, done.skipped, done.bytes_read)

    def _task(self, batch: SampleBatch) -> Task:
        task = Task(
            0,
            batch.indices,
            starts=batch.starts,
            sizes=batch.sizes,
            packed=batch.packed,
            labels=batch.labels,
            columns=_detach(batch.columns, batch.data),
            failed_positions=sorted(batch.errors),
            bytes_read=batch.bytes_read,
        )
        if batch.data is not None:
            data = batch.data
            try:
                name, offset = self._slabs.locate(data)
            except ValueError:  # a source that made its own buffer: copy it into a slab once
                copy = self._slabs.acquire(len(data))
                copy[:] = data
                name, offset = self._slabs.locate(copy)
            task.data_ref = (name, offset, len(data))
        return task

    # ----------------------------------------------------------------- any thread
    def complete(self, result: Assembled) -> Assembled:
        return result

    def submit(self, indices: np.ndarray) -> concurrent.futures.Future[Assembled]:
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
        """Cancel unfinished batches, stop the workers, unlink the slabs. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            futures = list(self._futures)
        for future in futures:
            future.cancel()
        try:
            if _on_loop(self._loop):  # dropped by a callback on the loop: cannot wait
                self._loop.create_task(self._shutdown(futures))
            elif not self._loop.is_closed():
                done = asyncio.run_coroutine_threadsafe(self._shutdown(futures), self._loop)
                try:
                    done.result(timeout_s)
                except concurrent.futures.TimeoutError:
                    done.cancel()
        finally:
            self.pool.close()
            self._slabs.clear()

    @property
    def closed(self) -> bool:
        return self._closed


def _detach(columns: dict[str, Any] | None, data: np.ndarray | None) -> dict[str, Any] | None:
    """String columns packed into the batch's data go as offsets only: the bytes are in the
    slab the task names, and the worker re-attaches them there."""
    if columns is None or data is None:
        return columns
    return {
        name: values.detached()
        if isinstance(values, PackedStrings) and values.data is data
        else values
        for name, values in columns.items()
    }
