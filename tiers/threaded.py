"""ThreadEngine: the reference engine and the fallback, a thread pool issuing preadv/pwritev.

Every request of a batch is queued at once to ``queue_depth`` worker threads, each doing blocking
``preadv``/``pwritev`` (the GIL is released in the syscall) straight into the caller's buffer.
One ``call_soon_threadsafe`` per batch hands the finished batch back to the loop: the cost per
I/O is a queue hand-off, not an asyncio future. All OS calls go through the engine's ``Env``.

Concurrency: ``_start`` runs in the loop thread; workers touch only their own request rows of a
batch and the batch's ``pending`` count (guarded by ``self._lock``).
"""

from __future__ import annotations

import asyncio
import queue
import threading

from tiers.batch import IOBatch, Op
from tiers.buffers import BufferRef
from tiers.engine import FileHandle, IOEngine
from tiers.env import Env
from tiers.errors import StorageError, error_from_errno

__all__ = ["ThreadEngine"]

_STOP = None


class ThreadEngine(IOEngine):
    """Thread-pool engine: works wherever ``os.preadv`` does."""

    name = "thread"

    def __init__(self, queue_depth: int = 64, env: Env | None = None) -> None:
        super().__init__(queue_depth, env)
        self._queue: queue.SimpleQueue[tuple[IOBatch, int] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def _start(self, batch: IOBatch) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        n = len(batch)
        live = n - int((batch.lengths == 0).sum()) if n else 0
        batch.pending = live
        if not live:
            self._complete(batch)
            return
        self._grow_pool(live)
        put = self._queue.put
        for index in range(n):
            if batch.lengths[index] or batch.ops[index] >= Op.FSYNC:
                put((batch, index))

    def _grow_pool(self, wanted: int) -> None:
        while len(self._workers) < min(wanted, self.queue_depth):
            worker = threading.Thread(
                target=self._work, name=f"tierkit-io-{len(self._workers)}", daemon=True
            )
            worker.start()
            self._workers.append(worker)

    def _work(self) -> None:
        get = self._queue.get
        while (item := get()) is not _STOP:
            batch, index = item
            try:
                batch.results[index] = self._transfer(batch, index)
            except OSError as exc:
                batch.errors[index] = _typed(exc, batch, index)
            except BaseException as exc:  # keep the worker alive; report to the caller
                batch.errors[index] = exc
            with self._lock:
                batch.pending -= 1
                done = batch.pending == 0
            if done:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._complete, batch)

    def _transfer(self, batch: IOBatch, index: int) -> int:
        op = batch.ops[index]
        file: FileHandle = batch.files[index]
        if op >= Op.FSYNC:
            (self.env.fdatasync if op == Op.FDATASYNC else self.env.fsync)(file.fd)
            return 0
        length = int(batch.lengths[index])
        offset = int(batch.offsets[index])
        view = BufferRef(int(batch.addresses[index]), length, True, None).memoryview()
        call = self.env.preadv if op == Op.READ else self.env.pwritev
        done = 0
        while done < length:
            moved = call(file.fd, [view[done:]], offset + done)
            if moved <= 0:
                if op == Op.READ:
                    break  # end of file
                raise OSError(5, "write made no progress", file.path)
            done += moved
            if done < length:
                self.counters["short_transfers_resumed"] += 1
                if file.direct and done % file.alignment_bytes:
                    break  # O_DIRECT only stops off-alignment at end of file
        return done

    async def _shutdown(self) -> None:
        for _ in self._workers:
            self._queue.put(_STOP)
        workers, self._workers = self._workers, []
        await asyncio.to_thread(lambda: [w.join() for w in workers])


def _typed(exc: OSError, batch: IOBatch, index: int) -> StorageError:
    error = error_from_errno(exc.errno or 5, batch.files[index].path, int(batch.offsets[index]))
    error.__cause__ = exc
    return error
