"""UringEngine: io_uring driven from pure Python (ctypes + mmap + numpy), no compiler needed.

The ring lives in the asyncio loop's thread. A batch takes free slots (one per request in
flight, at most ``queue_depth``), its SQEs are filled in one vectorised step, and one
``io_uring_enter`` submits them. Completions wake the loop through an eventfd registered with
the ring (``IORING_REGISTER_EVENTFD``) and with the loop (``add_reader``): no thread, no busy
spinning. Registered files are used for every open file, and registered buffers
(``register_buffers``) turn reads and writes inside them into READ_FIXED/WRITE_FIXED.

Short transfers are resumed from where they stopped; EAGAIN/EINTR completions are retried.
No SQPOLL: on small VMs its polling thread starves the submitter (about 10x slower).

Layout: this file sets the ring up and drives it (``_drive``: the compiled loop of
``compiled_drive`` when numba is there, else the Python loop); ``submission`` builds SQEs,
``completion`` turns CQEs into results, ``singles`` gathers single requests.

Concurrency: loop-thread only (the ring is SINGLE_ISSUER). Invariants: a slot is free or owned
by exactly one in-flight request; ``_pending`` holds batches whose rows are not all submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from tiers.io.batch import IOBatch
from tiers.io.buffers import as_buffer
from tiers.io.engine import FileHandle
from tiers.io.env import Env, default_env
from tiers.io.errors import EngineUnavailableError, InvalidArgumentError
from tiers.io.uring import abi
from tiers.io.uring.compiled_drive import CompiledDriver
from tiers.io.uring.completion import CompletionMixin
from tiers.io.uring.ring import Ring
from tiers.io.uring.singles import SINGLE_KEY
from tiers.io.uring.submission import WATCHDOG_S

__all__ = ["UringEngine"]


_PROBED: list[str | None] = []  # the default Env's probe answer, once known


def _probe(env: Env) -> str | None:
    try:
        Ring(4, env).close()
    except EngineUnavailableError as exc:
        return exc.reason
    except OSError as exc:
        return f"io_uring set-up failed: {exc}"
    return None


class UringEngine(CompletionMixin):
    """io_uring engine. Raises EngineUnavailableError where the kernel refuses io_uring."""

    name = "uring"
    gathers_singles = True

    def __init__(
        self, queue_depth: int = 128, env: Env | None = None, max_files: int = 1024
    ) -> None:
        super().__init__(queue_depth, env)
        self.max_files = max_files
        self._ring: Ring | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._new_future: Any = None
        self._eventfd = -1
        self._fixed_files = False
        self._free_file_slots: list[int] = []
        depth = queue_depth
        self._slot_key = np.zeros(depth, np.int64)  # key of the owning batch (0: a single)
        self._slot_row = np.zeros(depth, np.int64)  # row of the request (a single: its id)
        self._slot_done = np.zeros(depth, np.int64)  # bytes already moved by resumed requests
        self._slot_len = np.zeros(depth, np.int64)  # bytes asked of the SQE now in flight
        self._free = np.arange(depth - 1, -1, -1, dtype=np.intp)  # a stack of free slots
        self._nfree = depth
        self._rows = np.arange(max(depth, 4096), dtype=np.int64)
        self._batches: dict[int, IOBatch] = {}  # key -> batch with requests not yet finished
        self._left = np.zeros(64, np.int64)  # key -> requests of the batch not yet finished
        self._left[SINGLE_KEY] = 1 << 62  # singles are counted one by one, never "finished"
        self._free_keys = list(range(len(self._left) - 1, SINGLE_KEY, -1))
        self._pending: deque[list[Any]] = deque()  # [batch, first row not yet submitted, key]
        self._single_recs: dict[int, Any] = {}  # id -> a single request not yet finished
        self._next_single_id = 0
        self._q_offsets: list[int] = []  # singles not yet in a slot, in call order (see singles)
        self._q_addresses: list[int] = []
        self._q_lengths: list[int] = []
        self._q_file: FileHandle | None = None
        self._q_op = 0
        self._q_uniform = False
        self._inflight = 0
        self._resumed = 0  # slots now resuming a short transfer
        self._flush_scheduled = False
        self._watchdog: asyncio.TimerHandle | None = None
        self._buf_starts = np.zeros(0, np.uint64)
        self._buf_ends = np.zeros(0, np.uint64)
        self._buf_starts_list: list[int] = []
        self._buf_owners: list[Any] = []
        self._compiled: CompiledDriver | None = None
        self.counters.update(watchdog_reaps=0, wakeups=0, completion_waves=0)

    # ------------------------------------------------------------------ set-up
    @classmethod
    def probe(cls, env: Env | None = None) -> str | None:
        """None when io_uring works here, else the reason it does not.

        With the default Env the answer is kept for the process: a probe makes and closes a
        ring, and each close waits ~15 ms for the kernel's teardown (``ring_exit``).
        """
        if env is not None and env is not default_env:
            return _probe(env)
        if not _PROBED:
            _PROBED.append(_probe(default_env))
        return _PROBED[0]

    def _ensure_ring(self) -> Ring:
        if self._ring is not None:
            if asyncio.get_running_loop() is not self._loop:
                raise InvalidArgumentError(
                    "this UringEngine belongs to another event loop; create one per loop"
                )
            return self._ring
        loop = asyncio.get_running_loop()
        ring = Ring(self.queue_depth, self.env)
        try:
            self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            fd_array = ctypes.c_int32(self._eventfd)
            ring.register(abi.REGISTER_EVENTFD, ctypes.addressof(fd_array), 1)
            loop.add_reader(self._eventfd, self._on_wakeup)
        except BaseException:
            ring.close()
            raise
        self._fixed_files = self._register_file_table(ring)
        self._loop = loop
        self._new_future = (
            functools.partial(asyncio.Future, loop=loop)  # the same future, a Python call fewer
            if type(loop).create_future is asyncio.BaseEventLoop.create_future
            else loop.create_future
        )
        self._ring = ring
        self._compiled = CompiledDriver.create(self, ring)
        return ring

    def _register_file_table(self, ring: Ring) -> bool:
        table = (ctypes.c_int32 * self.max_files)(*([-1] * self.max_files))
        try:
            ring.register(abi.REGISTER_FILES, ctypes.addressof(table), self.max_files)
        except OSError:
            return False  # old kernel: plain descriptors work too
        self._free_file_slots = list(range(self.max_files - 1, -1, -1))
        return True

    def _attach(self, file: FileHandle) -> None:
        ring = self._ensure_ring()
        if not self._fixed_files or not self._free_file_slots:
            return
        slot = self._free_file_slots.pop()
        self._update_file_slot(ring, slot, file.fd)
        file.slot = slot

    def _detach(self, file: FileHandle) -> None:
        if file.slot >= 0 and self._ring is not None:
            self._update_file_slot(self._ring, file.slot, -1)
            self._free_file_slots.append(file.slot)
            file.slot = -1

    @staticmethod
    def _update_file_slot(ring: Ring, slot: int, fd: int) -> None:
        fds = ctypes.c_int32(fd)
        update = abi.FilesUpdate(slot, 0, ctypes.addressof(fds))
        ring.register(abi.REGISTER_FILES_UPDATE, ctypes.addressof(update), 1)

    async def register_buffers(self, buffers: Sequence[Any]) -> None:
        """Register host buffers (e.g. an AlignedBufferPool's ``arena``) with the kernel; I/O
        that falls inside one then skips per-I/O page pinning. Once per engine.

        Raises: InvalidArgumentError when already registered or not possible (RLIMIT_MEMLOCK).
        """
        ring = self._ensure_ring()
        if self._buf_owners:
            raise InvalidArgumentError("buffers are already registered with this engine")
        refs = sorted((as_buffer(b) for b in buffers), key=lambda r: r.address)
        iovecs = (abi.Iovec * len(refs))(*[abi.Iovec(r.address, r.size_bytes) for r in refs])
        try:
            ring.register(abi.REGISTER_BUFFERS, ctypes.addressof(iovecs), len(refs))
        except OSError as exc:
            raise InvalidArgumentError(f"cannot register buffers: {exc}") from exc
        self._buf_starts = np.array([r.address for r in refs], np.uint64)
        self._buf_ends = np.array([r.address + r.size_bytes for r in refs], np.uint64)
        self._buf_owners = [r.owner for r in refs]
        self._buf_starts_list = [r.address for r in refs]

    # ------------------------------------------------------------------ submission
    def _start(self, batch: IOBatch) -> None:
        self._ensure_ring()
        if not self._free_keys:
            grown = len(self._left)
            self._left = np.concatenate((self._left, np.zeros(grown, np.int64)))
            self._free_keys = list(range(2 * grown - 1, grown - 1, -1))
        key = self._free_keys.pop()
        batch.pending = len(batch)
        self._left[key] = len(batch)
        self._batches[key] = batch
        self._pending.append([batch, 0, key])
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            # Submit at the end of this loop iteration: every batch started meanwhile (say, 16
            # concurrent small gets) shares one io_uring_enter and one completion wave.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)  # type: ignore[union-attr]

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._ring is not None:
            self._drive()

    def _drive(self, woken: bool = False) -> None:
        """Submit what fits, run and reap completions, refill; until nothing more completes.

        A loop, not mutual recursion: a huge batch of cached reads completes inline, wave after
        wave, and must not grow the stack. Our own io_uring_enter posts CQEs, which signals the
        eventfd again; clearing it before we sleep saves the loop a wakeup that finds nothing.
        """
        assert self._ring is not None
        if self._compiled is not None:
            self._compiled.drive(woken)
            return
        reaped = woken
        while True:
            self._fill_singles()
            self._fill()
            self._enter()  # submits, and runs completions the kernel deferred to us
            if self._harvest():
                reaped = True
                continue
            if not reaped:
                return
            # Quiet now. Clear the eventfd, then look once more, so a completion that arrived
            # just before the clear is not left without a wakeup.
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._eventfd)
            reaped = False

    # ------------------------------------------------------------------ completion
    def _on_wakeup(self) -> None:
        self.counters["wakeups"] += 1
        if self._ring is not None:
            self._drive(woken=True)  # runs deferred completions, submits anything queued

    def _on_watchdog(self) -> None:
        """A safety net against a lost wakeup: never needed so far, counted if it ever is."""
        self._watchdog = None
        if not self._inflight or self._ring is None:
            return
        if self._ring.reap_ready():
            self.counters["watchdog_reaps"] += 1
        self._drive()
        if self._inflight and self._watchdog is None:
            self._watchdog = self._loop.call_later(WATCHDOG_S, self._on_watchdog)  # type: ignore[union-attr]

    # ------------------------------------------------------------------ shutdown
    async def _shutdown(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._ring is None:
            return
        assert self._loop is not None
        self._loop.remove_reader(self._eventfd)
        self._ring.close()
        os.close(self._eventfd)
        self._ring = None
        self._buf_owners = []
