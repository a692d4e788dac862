"""UringEngine: io_uring driven from pure Python (ctypes + mmap + numpy), no compiler needed.

The ring lives in the asyncio loop's thread. A batch takes free slots (one per request in
flight, at most ``queue_depth``), its SQEs are filled in one vectorised step, and one
``io_uring_enter`` submits them. Completions wake the loop through an eventfd registered with
the ring (``IORING_REGISTER_EVENTFD``) and with the loop (``add_reader``): no thread, no busy
spinning. Registered files are used for every open file, and registered buffers
(``register_buffers``) turn reads and writes inside them into READ_FIXED/WRITE_FIXED.

Short transfers are resumed from where they stopped; EAGAIN/EINTR completions are retried.
No SQPOLL: on small VMs its polling thread starves the submitter (about 10x slower).

Concurrency: loop-thread only (the ring is SINGLE_ISSUER). Invariants: a slot is free or owned
by exactly one in-flight request; ``_pending`` holds batches whose rows are not all submitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from tiers import _uring_abi as abi
from tiers.batch import IOBatch, Op
from tiers.buffers import as_buffer
from tiers.engine import FileHandle, IOEngine
from tiers.env import Env
from tiers.errors import EngineUnavailableError, InvalidArgumentError, error_from_errno
from tiers.uring_ring import Ring

__all__ = ["UringEngine"]

_OPCODE = np.array([abi.OP_READ, abi.OP_WRITE, abi.OP_FSYNC, abi.OP_FSYNC], np.uint8)
_FIXED_OPCODE = np.array(
    [abi.OP_READ_FIXED, abi.OP_WRITE_FIXED, abi.OP_FSYNC, abi.OP_FSYNC], np.uint8
)
_RW_FLAGS = np.array([0, 0, 0, abi.FSYNC_DATASYNC], np.uint32)
_RETRY = {errno.EAGAIN, errno.EINTR}
_WATCHDOG_S = 0.25


class UringEngine(IOEngine):
    """io_uring engine. Raises EngineUnavailableError where the kernel refuses io_uring."""

    name = "uring"

    def __init__(
        self, queue_depth: int = 128, env: Env | None = None, max_files: int = 1024
    ) -> None:
        super().__init__(queue_depth, env)
        self.max_files = max_files
        self._ring: Ring | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._eventfd = -1
        self._fixed_files = False
        self._free_file_slots: list[int] = []
        depth = queue_depth
        self._slot_batch: list[IOBatch | None] = [None] * depth
        self._slot_row = np.zeros(depth, np.int64)
        self._slot_done = np.zeros(depth, np.int64)  # bytes already moved by resumed requests
        self._slot_len = np.zeros(depth, np.int64)  # bytes asked of the SQE now in flight
        self._free_slots = list(range(depth - 1, -1, -1))
        self._pending: deque[list[Any]] = deque()  # [batch, rows not yet submitted]
        self._inflight = 0
        self._watchdog: asyncio.TimerHandle | None = None
        self._buf_starts = np.zeros(0, np.uint64)
        self._buf_ends = np.zeros(0, np.uint64)
        self._buf_owners: list[Any] = []
        self.counters["watchdog_reaps"] = 0

    # ------------------------------------------------------------------ set-up
    @classmethod
    def probe(cls, env: Env | None = None) -> str | None:
        """None when io_uring works here, else the reason it does not."""
        try:
            Ring(4, env or Env()).close()
        except EngineUnavailableError as exc:
            return exc.reason
        except OSError as exc:
            return f"io_uring set-up failed: {exc}"
        return None

    def _ensure_ring(self) -> Ring:
        if self._ring is not None:
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
        self._ring = ring
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

    # ------------------------------------------------------------------ submission
    def _start(self, batch: IOBatch) -> None:
        self._ensure_ring()
        live = np.flatnonzero((batch.lengths > 0) | (batch.ops >= Op.FSYNC))
        batch.pending = len(live)
        if not len(live):
            self._complete(batch)
            return
        self._pending.append([batch, live])
        self._pump()

    def _pump(self) -> None:
        """Move pending rows into free slots and submit them in one io_uring_enter."""
        ring = self._ring
        assert ring is not None
        pushed = False
        while self._pending and self._free_slots:
            entry = self._pending[0]
            batch, rows = entry
            take = min(len(rows), len(self._free_slots))
            slots = np.array(self._free_slots[-take:][::-1], np.int64)
            del self._free_slots[-take:]
            head, entry[1] = rows[:take], rows[take:]
            if not len(entry[1]):
                self._pending.popleft()
            for slot in slots.tolist():
                self._slot_batch[slot] = batch
            self._slot_row[slots] = head
            self._slot_done[slots] = 0
            self._push(
                batch, slots, head, batch.offsets[head], batch.addresses[head], batch.lengths[head]
            )
            pushed = True
        if pushed:
            self._enter()

    def _push(
        self,
        batch: IOBatch,
        slots: np.ndarray,
        rows: np.ndarray,
        offsets: np.ndarray,
        addresses: np.ndarray,
        lengths: np.ndarray,
    ) -> None:
        ops = batch.ops[rows]
        opcodes = _OPCODE[ops]
        buf_index: np.ndarray | int = 0
        if len(self._buf_starts):
            k = np.searchsorted(self._buf_starts, addresses, side="right") - 1
            inside = (k >= 0) & (
                addresses + lengths.astype(np.uint64) <= self._buf_ends[np.maximum(k, 0)]
            )
            opcodes = np.where(inside, _FIXED_OPCODE[ops], opcodes)
            buf_index = np.maximum(k, 0).astype(np.uint16)
        first = batch.files[rows[0]]
        if all(batch.files[r] is first for r in rows.tolist()) if len(rows) > 1 else True:
            fd, flags = (first.slot, abi.SQE_FIXED_FILE) if first.slot >= 0 else (first.fd, 0)
        else:
            files = [batch.files[r] for r in rows.tolist()]
            fd = np.array([f.slot if f.slot >= 0 else f.fd for f in files], np.int32)
            flags = np.array([abi.SQE_FIXED_FILE if f.slot >= 0 else 0 for f in files], np.uint8)
        self._slot_len[slots] = lengths
        self._inflight += len(slots)
        assert self._ring is not None
        self._ring.push(
            opcode=opcodes,
            flags=flags,
            fd=fd,
            off=offsets.astype(np.uint64),
            addr=addresses,
            len=lengths.astype(np.uint32),
            rw_flags=_RW_FLAGS[ops],
            user_data=slots.astype(np.uint64),
            buf_index=buf_index,
        )
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(_WATCHDOG_S, self._on_watchdog)  # type: ignore[union-attr]

    def _enter(self) -> None:
        assert self._ring is not None
        try:
            self._ring.enter()
        except (BlockingIOError, OSError) as exc:
            if exc.errno not in (errno.EAGAIN, errno.EBUSY):
                raise
            # the kernel is short of resources: unsubmitted SQEs stay queued and the next
            # completion (or the watchdog) submits them
        self._harvest()

    # ------------------------------------------------------------------ completion
    def _on_wakeup(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._eventfd)
        if self._ring is not None:
            self._enter()  # runs deferred completions and submits anything left queued
            self._pump()

    def _on_watchdog(self) -> None:
        self._watchdog = None
        if not self._inflight or self._ring is None:
            return
        before = self.counters["requests"]
        self._on_wakeup()
        if self.counters["requests"] != before:
            self.counters["watchdog_reaps"] += 1
        if self._inflight and self._watchdog is None:
            self._watchdog = self._loop.call_later(_WATCHDOG_S, self._on_watchdog)  # type: ignore[union-attr]

    def _harvest(self) -> None:
        assert self._ring is not None
        while (cqes := self._ring.reap()) is not None:
            user_data, res = cqes
            slots = user_data.astype(np.int64)
            res = res.astype(np.int64)
            ok = res == self._slot_len[slots]
            if not ok.all():
                self._handle_unusual(slots[~ok], res[~ok])
                slots, res = slots[ok], res[ok]
            if len(slots):
                self._finish(slots, res + self._slot_done[slots])
        if self._free_slots and self._pending:
            self._pump()

    def _handle_unusual(self, slots: np.ndarray, res: np.ndarray) -> None:
        """Errors, EOF and short transfers: rare, so handled one by one."""
        for slot, result in zip(slots.tolist(), res.tolist(), strict=True):
            batch = self._slot_batch[slot]
            assert batch is not None
            row = int(self._slot_row[slot])
            file = batch.files[row]
            done = int(self._slot_done[slot])
            if result < 0 and -result in _RETRY:
                self._resubmit(slot, batch, row, done)
                continue
            if result < 0:
                batch.errors[row] = error_from_errno(
                    -result, file.path, int(batch.offsets[row]) + done
                )
                self._finish_one(slot, done)
                continue
            done += result
            is_read = batch.ops[row] == Op.READ
            if result == 0 and not is_read:
                batch.errors[row] = error_from_errno(
                    errno.EIO, file.path, int(batch.offsets[row]) + done
                )
                self._finish_one(slot, done)
            elif result == 0 or (file.direct and done % file.alignment_bytes):
                self._finish_one(slot, done)  # end of file
            else:
                self.counters["short_transfers_resumed"] += 1
                self._resubmit(slot, batch, row, done)

    def _resubmit(self, slot: int, batch: IOBatch, row: int, done: int) -> None:
        self._slot_done[slot] = done
        self._inflight -= 1
        rows = np.array([row], np.int64)
        self._push(
            batch,
            np.array([slot], np.int64),
            rows,
            batch.offsets[rows] + done,
            batch.addresses[rows] + np.uint64(done),
            batch.lengths[rows] - done,
        )
        assert self._ring is not None
        self._ring.enter(get_events=False)

    def _finish_one(self, slot: int, done: int) -> None:
        self._finish(np.array([slot], np.int64), np.array([done], np.int64))

    def _finish(self, slots: np.ndarray, done: np.ndarray) -> None:
        """Record results of finished requests, free their slots, complete whole batches."""
        self._inflight -= len(slots)
        slot_batch = self._slot_batch
        slot_list = slots.tolist()
        first = slot_batch[slot_list[0]]
        if all(slot_batch[s] is first for s in slot_list):
            groups = [(first, slots, done)]
        else:
            by_batch: dict[int, list[int]] = {}
            for i, s in enumerate(slot_list):
                by_batch.setdefault(id(slot_batch[s]), []).append(i)
            groups = [
                (slot_batch[slot_list[ix[0]]], slots[ix], done[ix]) for ix in by_batch.values()
            ]
        for s in slot_list:
            slot_batch[s] = None
        self._free_slots.extend(slot_list)
        for batch, group_slots, group_done in groups:
            assert batch is not None
            batch.results[self._slot_row[group_slots]] = group_done
            batch.pending -= len(group_slots)
            if batch.pending == 0:
                self._complete(batch)

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
