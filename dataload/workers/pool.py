"""ProcessPool: the loader's worker processes, driven from the I/O runtime's event loop.

Workers come from multiprocessing's **forkserver** context: each is forked from a small
single-threaded server that preloaded torch, numpy and the worker module, so a worker starts in
tens of milliseconds (spawn re-imports torch: a second or more per worker) and never inherits
the loader process's threads, locks or io_uring rings -- forking the loader itself (the "fork"
context) copies a process whose loop thread may hold a lock mid-submission. The pool that starts
the server also has it preload the modules its work comes from (``preload``: the transform's,
the dataset's), so that each worker does not import them again; DataLoader's fork workers
inherit them from the loader's process the same way. The server and
multiprocessing's resource tracker are started once per interpreter and shared, as with
DataLoader under forkserver.

Each worker has one duplex pipe. No multiprocessing Queue is used, so there are no semaphores
to leak and no feeder threads; the pipes and each process's sentinel are watched with
``loop.add_reader``, so the pool adds no thread. Batches are dealt round-robin in submission
order (as DataLoader deals them), at most two in a worker's pipe, the second only if its pickle
is small: a pipe write can then never block the loop while the worker is blocked writing its
result.

A worker that exits (killed, crashed) fails the batches it held with WorkerDiedError and
breaks the pool: every later ``run`` fails with the same error, nothing waits forever.
``close`` sends STOP (SIGTERM to a worker still starting up), joins for ``join_timeout_s``,
then terminates and kills what is left.

Concurrency: ``run`` and the reader callbacks run on the loop thread; ``start`` and ``close``
on any other thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dataload.workers.protocol import READY, STOP, Done, Failed, Task, WorkerDiedError
from dataload.workers.worker import worker_main

__all__ = ["ProcessPool", "forkserver_context", "forkserver_running", "warm_forkserver"]

_SMALL_TASK_BYTES = 16 * 1024  # far below a pipe's 64 KiB buffer: writing it never blocks


# what every worker imports; numpy.random too: a worker seeds it, and its first import is 5 ms
_PRELOAD = ("__main__", "torch", "numpy", "numpy.random", "dataload.workers.worker")


def forkserver_context(preload: Sequence[str] = ()) -> Any:
    """The forkserver context, preloading what every worker imports plus ``preload``.

    The list takes effect when the server starts (once per interpreter); later calls with other
    modules change nothing for a running server.
    """
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(dict.fromkeys((*_PRELOAD, *preload))))
    return context


def forkserver_running() -> bool:
    """Whether this interpreter's forkserver has been started (and so its preload is fixed)."""
    from multiprocessing import forkserver

    return bool(getattr(forkserver._forkserver, "_forkserver_pid", None))


def warm_forkserver(preload: Sequence[str] = ()) -> float:
    """Start the forkserver (importing torch there) now and wait until it serves; seconds taken.

    The first loader with worker processes does this itself; a training script can call it
    early -- before building the model, say -- so that the once-per-process start overlaps
    other work instead of delaying the first batch. ``preload``: modules the workers will need
    (a transform's, a dataset's), imported once in the server instead of in every worker; a
    script run as a file has its ``__main__`` (and what it imports) preloaded anyway.
    """
    started = time.perf_counter()
    process = forkserver_context(preload).Process(target=os.getpid, daemon=True)
    process.start()
    process.join()
    process.close()
    return time.perf_counter() - started


@dataclass
class _Worker:
    worker_id: int
    process: Any
    conn: multiprocessing.connection.Connection
    ready: bool = False
    in_pipe: deque[tuple[int, list[int]]] = field(default_factory=deque)  # task id, indices
    waiting: deque[tuple[int, bytes, list[int]]] = field(default_factory=deque)


class ProcessPool:
    """``num_workers`` worker processes serving tasks; ``await run(task)`` gives a Done."""

    def __init__(
        self,
        num_workers: int,
        payload: bytes,
        base_seed: int,
        loop: asyncio.AbstractEventLoop,
        context: Any = None,
        join_timeout_s: float = 5.0,
        preload: Sequence[str] = (),
    ) -> None:
        self.num_workers = num_workers
        self.base_seed = base_seed
        self.join_timeout_s = join_timeout_s
        self._loop = loop
        self._context = context or forkserver_context(preload)
        self._ids = itertools.count()
        self._next_worker = itertools.cycle(range(num_workers))
        self._futures: dict[int, asyncio.Future[Done]] = {}
        self._broken: Callable[[], BaseException] | None = None  # makes the error anew
        self._closed = False
        self.workers: list[_Worker] = []
        try:
            for worker_id in range(num_workers):
                mine, theirs = self._context.Pipe(duplex=True)
                process = self._context.Process(
                    target=worker_main,
                    args=(worker_id, num_workers, theirs, payload, base_seed),
                    name=f"tierkit-loader-worker-{worker_id}",
                    daemon=True,
                )
                process.start()
                theirs.close()
                self.workers.append(_Worker(worker_id, process, mine))
            asyncio.run_coroutine_threadsafe(self._watch(), loop).result()
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [w.process.pid for w in self.workers]

    # ----------------------------------------------------------------- loop thread
    async def _watch(self) -> None:
        for worker in self.workers:
            self._loop.add_reader(worker.conn.fileno(), self._on_message, worker)
            self._loop.add_reader(worker.process.sentinel, self._on_exit, worker)

    def _unwatch(self) -> None:
        for worker in self.workers:
            for fd in (worker.conn, worker.process.sentinel):
                with contextlib.suppress(OSError, ValueError):
                    self._loop.remove_reader(fd if isinstance(fd, int) else fd.fileno())

    async def run(self, task: Task) -> Done:
        """Send ``task`` to the next worker in turn; its Done (a Failed is raised)."""
        if self._broken is not None:
            raise self._broken()
        if self._closed:
            raise WorkerDiedError(-1, None, None, [])
        task.task_id = next(self._ids)
        data = pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
        future: asyncio.Future[Done] = self._loop.create_future()
        self._futures[task.task_id] = future
        worker = self.workers[next(self._next_worker)]
        worker.waiting.append((task.task_id, data, task.indices.tolist()))
        self._pump(worker)
        try:
            return await future
        finally:
            self._futures.pop(task.task_id, None)

    def _pump(self, worker: _Worker) -> None:
        """Move waiting tasks into the worker's pipe while that cannot block."""
        while worker.waiting:
            task_id, data, indices = worker.waiting[0]
            future = self._futures.get(task_id)
            if future is None or future.done():  # cancelled before it was sent
                worker.waiting.popleft()
                continue
            if worker.in_pipe and (len(worker.in_pipe) >= 2 or len(data) > _SMALL_TASK_BYTES):
                return
            worker.waiting.popleft()
            try:
                worker.conn.send_bytes(data)
            except OSError:
                self._on_exit(worker)
                return
            worker.in_pipe.append((task_id, indices))

    def _on_message(self, worker: _Worker) -> None:
        try:
            data = worker.conn.recv_bytes()
        except (EOFError, OSError):
            self._on_exit(worker)
            return
        if data == READY:
            worker.ready = True
            return
        reply = pickle.loads(data)
        if isinstance(reply, Failed) and reply.task_id == -1:  # worker_init_fn or unpickling
            pid = worker.process.pid
            self._break(lambda: reply.exception(worker.worker_id, pid))
            return
        if worker.in_pipe and worker.in_pipe[0][0] == reply.task_id:
            worker.in_pipe.popleft()
        future = self._futures.get(reply.task_id)
        if future is not None and not future.done():
            if isinstance(reply, Failed):
                future.set_exception(reply.exception(worker.worker_id, worker.process.pid))
            else:
                future.set_result(reply)
        self._pump(worker)

    def _on_exit(self, worker: _Worker) -> None:
        if self._closed or self._broken is not None:
            self._unwatch()
            return
        worker.process.join(1.0)  # the sentinel fired: it has exited, or is about to
        held = [i for _, indices in worker.in_pipe for i in indices]
        held += [i for _, _, indices in worker.waiting for i in indices]
        facts = (worker.worker_id, worker.process.pid, worker.process.exitcode, held)
        self._break(lambda: WorkerDiedError(*facts))

    def _break(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every outstanding batch; later runs fail at once. Each gets its own exception
        object: one shared object would collect the traceback of every frame it passed,
        loader frames included, and the pool would keep a dropped loader alive through it."""
        self._broken = make_error
        self._unwatch()
        for future in self._futures.values():
            if not future.done():
                future.set_exception(make_error())

    # ----------------------------------------------------------------- any thread
    def close(self) -> None:
        """Stop every worker: STOP, join, then terminate and kill stragglers. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if _on_loop(self._loop):  # dropped by a callback on the loop itself
            self._unwatch()
        elif not self._loop.is_closed():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_call(self._unwatch), self._loop).result(10)
        for worker in self.workers:
            if worker.ready:
                with contextlib.suppress(OSError):
                    worker.conn.send_bytes(STOP)
            else:  # still starting: it holds nothing, and would finish starting to read STOP
                worker.process.terminate()
        _join_all([w.process for w in self.workers], self.join_timeout_s)
        for worker in self.workers:
            worker.conn.close()
            # a worker that survived SIGKILL (uninterruptible sleep) is left to the OS
            with contextlib.suppress(ValueError):
                worker.process.close()
        self.workers = []


async def _call(function: Any) -> None:
    function()


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _join_all(processes: list[Any], timeout_s: float) -> None:
    """Join, then SIGTERM, then SIGKILL: a worker stuck in user code cannot hold up close."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for stage in ("terminate", "kill"):
        alive = [p for p in processes if p.exitcode is None]
        for process in alive:
            getattr(process, stage)()
        for process in alive:
            process.join(2.0)
