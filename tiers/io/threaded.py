"""ThreadEngine: the reference engine and the fallback, a thread pool issuing preadv/pwritev.

A batch is handed to up to ``queue_depth`` worker threads at once; each worker claims rows from
the batch's shared cursor and does blocking ``preadv``/``pwritev`` (the GIL is released in the
syscall) straight into the caller's buffer, so up to ``queue_depth`` requests are in flight
and a worker takes its next row the moment its last one finishes. The pool grows with the rows
outstanding over all batches, not with one batch's size: 32 tasks each awaiting one
``read_into`` get 32 workers (sized by the batch, they shared one: queue depth 1). One
``call_soon_threadsafe`` per batch hands the finished batch back to the loop. All OS calls go
through the engine's Env.

Concurrency: ``_start`` runs in the loop thread; workers touch only the rows they claimed and
the batch's ``pending`` count (guarded by ``self._lock``). ``itertools.count`` hands out rows
atomically (its ``__next__`` runs under the GIL without releasing it).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading

import numpy as np

from tiers.io.batch import FDATASYNC, FSYNC, READ, IOBatch
from tiers.io.buffers import BufferRef
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.env import Env
from tiers.io.errors import StorageError, error_from_errno

__all__ = ["ThreadEngine"]

_STOP = None


class _Share:
    """One batch as seen by its workers: the row cursor and a view of its one buffer."""

    __slots__ = ("addresses", "batch", "cursor", "lengths", "offsets", "view")

    def __init__(self, batch: IOBatch) -> None:
        self.batch = batch
        self.cursor = itertools.count()
        self.view = batch.base.memoryview() if batch.base is not None else None
        # plain lists: workers index them without numpy scalar overhead (less GIL held per I/O)
        self.offsets = batch.offsets.tolist()
        self.lengths = batch.lengths.tolist()
        base = batch.base.address if batch.base is not None else 0
        self.addresses = (batch.addresses - np.uint64(base)).tolist()


class ThreadEngine(IOEngine):
    """Thread-pool engine: works wherever ``os.preadv`` does."""

    name = "thread"

    def __init__(self, queue_depth: int = 64, env: Env | None = None) -> None:
        super().__init__(queue_depth, env)
        self._queue: queue.SimpleQueue[_Share | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outstanding_rows = 0  # submitted, not yet done, over all batches (self._lock)

    def _start(self, batch: IOBatch) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        batch.pending = len(batch)
        share = _Share(batch)
        helpers = min(len(batch), self.queue_depth)
        with self._lock:
            self._outstanding_rows += len(batch)
            outstanding = self._outstanding_rows
        self._grow_pool(min(outstanding, self.queue_depth))
        for _ in range(helpers):
            self._queue.put(share)

    def _grow_pool(self, wanted: int) -> None:
        while len(self._workers) < wanted:
            worker = threading.Thread(
                target=self._work, name=f"tierkit-io-{len(self._workers)}", daemon=True
            )
            worker.start()
            self._workers.append(worker)

    def _work(self) -> None:
        get = self._queue.get
        while (share := get()) is not _STOP:
            batch = share.batch
            n = len(batch)
            done = 0
            for row in share.cursor:
                if row >= n:
                    break
                self._run_row(share, row)
                done += 1
            if not done:
                continue
            with self._lock:
                batch.pending -= done
                self._outstanding_rows -= done
                finished = batch.pending == 0
            if finished:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._complete, batch)

    def _run_row(self, share: _Share, row: int) -> None:
        batch = share.batch
        try:
            batch.results[row] = self._transfer(share, row)
        except OSError as exc:
            batch.errors[row] = _typed(exc, batch, row)
        except BaseException as exc:  # keep the worker alive; report to the caller
            batch.errors[row] = exc

    def _transfer(self, share: _Share, row: int) -> int:
        batch = share.batch
        op = batch.op if batch.op >= 0 else int(batch.ops[row])
        file: FileHandle = batch.file or batch.files[row]
        if op >= FSYNC:
            (self.env.fdatasync if op == FDATASYNC else self.env.fsync)(file.fd)
            return 0
        length = share.lengths[row]
        offset = share.offsets[row]
        if share.view is not None:
            start = share.addresses[row]
            target = share.view[start : start + length]
        else:
            target = BufferRef(share.addresses[row], length, True, None).memoryview()
        call = self.env.preadv if op == READ else self.env.pwritev
        done = 0
        while done < length:
            moved = call(file.fd, [target[done:] if done else target], offset + done)
            if moved <= 0:
                if op == READ:
                    break  # end of file
                raise OSError(5, "write made no progress", file.path)
            done += moved
            if done < length:
                with self._lock:  # counters are shared with the other workers
                    self.counters["short_transfers_resumed"] += 1
                if file.direct and done % file.alignment_bytes:
                    break  # O_DIRECT only stops off-alignment at end of file
        return done

    async def _shutdown(self) -> None:
        for _ in self._workers:
            self._queue.put(_STOP)
        workers, self._workers = self._workers, []
        await asyncio.to_thread(_join_all, workers)


def _typed(exc: OSError, batch: IOBatch, row: int) -> StorageError:
    error = error_from_errno(exc.errno or 5, batch.files[row].path, int(batch.offsets[row]))
    error.__cause__ = exc
    return error


def _join_all(workers: list[threading.Thread]) -> None:
    for worker in workers:
        worker.join()
