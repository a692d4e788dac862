"""Single ``read_into``/``write_from`` calls on UringEngine, gathered into shared submissions.

Why: 32 tasks each awaiting one 4 KiB read used to build 32 IOBatch objects (numpy arrays,
validation, a dict entry) and paid ~47 us of CPU per read. Here a call is one small record and
three list appends; every call made in the same loop iteration is written to the ring by the one
``_flush`` that the first of them scheduled, and each completion resolves its record's future
directly. When the queued calls share one file and one op (and no buffers are registered), the
compiled loop takes the queue's offsets, addresses and lengths as one uniform batch (see
``compiled_drive``), so the SQEs are written in machine code, not by numpy calls per wave.

Requests the light checks cannot vouch for (a negative offset, a misaligned O_DIRECT request, a
read-only file written) take the general path, which raises the same typed errors as before.

Concurrency: loop-thread only, like the rest of the engine. Invariants: a record is in
``_single_recs`` (keyed by its id; a slot holding it has that id as its row) from the call until
it finishes; ids are given in call order and slots are filled from the queue's front, so the
queue (``_q_offsets``, ``_q_addresses``, ``_q_lengths``) holds the ids ``_next_single_id - n``
.. ``_next_single_id - 1``, n its length; ``_q_uniform`` is true when every queued record has
``_q_file`` and ``_q_op`` and no buffers are registered; key 0 of the slot table marks slots
that hold a single.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
from _thread import get_ident
from typing import Any

import numpy as np

from tiers.io.batch import READ, WRITE
from tiers.io.buffers import array_address, as_buffer
from tiers.io.engine import FileHandle, IOEngine, wake_all
from tiers.io.errors import error_from_errno
from tiers.io.uring import abi

__all__ = ["SINGLE_KEY", "SinglesMixin", "single_word0"]

SINGLE_KEY = 0
# resumed callers per early flush (see ``_settle_singles``): 8 measured +7-10% reads/s for 32
# tasks at 4 KiB (in-process A/B, 2026-11-27), 4 cost more CPU than it won
EARLY_FLUSH_CALLERS = 8
_MAX_REQUEST_BYTES = 0x7FFFF000
_RETRY = {errno.EAGAIN, errno.EINTR}


def single_word0(file: FileHandle, opcode: int) -> int:
    """SQE word 0 (opcode, flags, fd) for a request on ``file``: its registered slot if any."""
    if file.slot >= 0:
        return opcode | abi.SQE_FIXED_FILE << 8 | file.slot << 32
    return opcode | (file.fd & 0xFFFFFFFF) << 32


class _Single:
    """One single request, read from its record (a plain tuple of these fields, in this order,
    is what ``_single_recs`` keeps: a tuple costs ~0.02 us to make, this class ~0.3)."""

    __slots__ = ("address", "file", "future", "length", "offset", "op", "owner")

    def __init__(
        self, future: Any, file: FileHandle, op: int, offset: int, address: int, length: int,
        owner: Any,
    ) -> None:  # fmt: skip
        self.future = future
        self.file = file
        self.op = op
        self.offset = offset
        self.address = address
        self.length = length
        self.owner = owner  # the caller's buffer stays alive while the kernel may write it


class SinglesMixin(IOEngine):
    """The single-request path; UringEngine supplies the ring, slots and ``_push``."""

    # future, file, op, offset, address, length, owner (the fields of _Single, in order)
    _single_recs: dict[int, tuple[Any, FileHandle, int, int, int, int, Any]]
    _next_single_id: int
    _q_offsets: list[int]
    _q_addresses: list[int]
    _q_lengths: list[int]
    _q_file: FileHandle | None
    _q_op: int
    _q_uniform: bool
    _buf_starts_list: list[int]
    _buf_ends: np.ndarray
    _free: np.ndarray
    _nfree: int
    _inflight: int
    _resumed: int
    _ring: Any
    _slot_key: np.ndarray
    _slot_row: np.ndarray
    _slot_done: np.ndarray
    _loop: Any
    _new_future: Any  # the loop's create_future, or Future(loop=) where that is the same
    _flush_scheduled: bool

    async def read_into(self, file: FileHandle, offset_bytes: int, buffer: Any) -> int:
        """Read into all of ``buffer`` from ``offset_bytes``; returns bytes read (short = EOF)."""
        single = self._single(READ, file, offset_bytes, buffer)
        if single is None:
            return await super().read_into(file, offset_bytes, buffer)
        return await single

    async def write_from(self, file: FileHandle, offset_bytes: int, buffer: Any) -> int:
        """Write all of ``buffer`` at ``offset_bytes``; returns the bytes written."""
        single = self._single(WRITE, file, offset_bytes, buffer)
        if single is None:
            return await super().write_from(file, offset_bytes, buffer)
        return await single

    def _single(self, op: int, file: FileHandle, offset: int, buffer: Any) -> Any:
        """Queue one request and return its future, or None for the general path."""
        if self._closing or file.closed or type(offset) is not int or offset < 0:
            return None
        flags = buffer.flags if type(buffer) is np.ndarray else None
        if flags is not None and flags.c_contiguous:
            # the common case without building a BufferRef (about 1 us of a 4 KiB read's ~10)
            if op == READ and not flags.writeable:
                return None
            address, length = array_address(buffer), buffer.nbytes
        else:
            try:
                ref = as_buffer(buffer)
            except Exception:
                return None  # the general path raises the typed error
            address, length = ref.address, ref.size_bytes
            if op == READ and not ref.writable:
                return None
            buffer = ref.owner
        if length > _MAX_REQUEST_BYTES or (op == WRITE and not file.writable):
            return None
        if file.direct and (offset | length | address) & (file.alignment_bytes - 1):
            return None
        # asyncio's loops keep the id of the thread running them: ours, and the running loop
        # is ours, without get_running_loop's getpid() (other loops: asked)
        loop = self._loop
        if self._ring is None or (
            getattr(loop, "_thread_id", None) != get_ident()
            and loop is not asyncio.get_running_loop()
        ):
            self._ensure_ring()  # type: ignore[attr-defined]  # set-up, or the wrong-loop error
        future = self._new_future()
        single_id = self._next_single_id
        self._next_single_id = single_id + 1
        self._single_recs[single_id] = (future, file, op, offset, address, length, buffer)
        q_offsets = self._q_offsets
        if q_offsets:
            if file is not self._q_file or op != self._q_op:
                self._q_uniform = False
        else:
            self._q_file, self._q_op = file, op
            self._q_uniform = not self._buf_starts_list
        if not self._flush_scheduled:
            self._schedule_flush()  # type: ignore[attr-defined]
        q_offsets.append(offset)
        self._q_addresses.append(address)
        self._q_lengths.append(length)
        file.inflight += 1
        self._inflight_batches += 1
        return future

    def _queued_ids(self) -> range:
        return range(self._next_single_id - len(self._q_offsets), self._next_single_id)

    def _dequeue_singles(self, count: int) -> None:
        """The first ``count`` queued singles went into slots: drop them from the queue."""
        if count == len(self._q_offsets):
            self._q_offsets.clear()
            self._q_addresses.clear()
            self._q_lengths.clear()
            return
        del self._q_offsets[:count], self._q_addresses[:count], self._q_lengths[:count]
        if not self._q_uniform:  # the rest may be uniform now (rare: mixed files or ops)
            recs = self._single_recs
            ids = self._queued_ids()
            _, file, op = recs[ids[0]][:3]
            self._q_file, self._q_op = file, op
            self._q_uniform = not self._buf_starts_list and all(
                recs[i][1] is file and recs[i][2] == op for i in ids
            )

    def _fill_singles(self) -> None:
        """Write queued singles into free slots (the Python path; the compiled loop takes a
        uniform queue itself): one numpy call per SQE word for all of them."""
        take = min(len(self._q_offsets), self._nfree)
        if not take:
            return
        nfree = self._nfree
        slots = self._free[nfree - take : nfree].copy()
        ids = self._queued_ids()[:take]
        recs = self._single_recs
        addresses, lengths = self._q_addresses[:take], self._q_lengths[:take]
        words = [
            self._single_words(_Single(*recs[i]), a, n)
            for i, a, n in zip(ids, addresses, lengths, strict=True)
        ]
        length_array = np.array(lengths, np.int64)
        self._push(  # type: ignore[attr-defined]
            np.array([w[0] for w in words], np.uint64),
            np.array(self._q_offsets[:take], np.uint64),
            np.array(addresses, np.uint64),
            length_array,
            slots,
            np.array([w[1] for w in words], np.uint64),
            length_array,
            0,
        )
        self._nfree = nfree - take
        self._slot_key[slots] = SINGLE_KEY
        self._slot_row[slots] = np.arange(ids.start, ids.stop)
        self._dequeue_singles(take)

    def _single_words(self, rec: _Single, address: int, length: int) -> tuple[int, int]:
        """SQE word 0 (opcode, flags, fd) and word 5 (buffer index) for one request."""
        opcode = abi.OP_READ if rec.op == READ else abi.OP_WRITE
        buf_index = 0
        starts = self._buf_starts_list
        if starts:
            k = bisect.bisect_right(starts, address) - 1
            if k >= 0 and address + length <= int(self._buf_ends[k]):
                opcode = abi.OP_READ_FIXED if rec.op == READ else abi.OP_WRITE_FIXED
                buf_index = k
        return single_word0(rec.file, opcode), buf_index

    def _settle_singles(self, ids: list[int], results: list[int]) -> None:
        """Finish singles that moved all they asked: what ``_single_done`` does, in one pass.

        When the device holds fewer requests than this wave resumes (most of the callers'
        requests wait on Python, not on the device), a flush is queued after every
        ``EARLY_FLUSH_CALLERS`` resumed callers: the requests they make next reach the kernel
        before the rest of the wave runs, instead of all at the end of the loop pass.
        """
        recs = self._single_recs
        read_bytes = written_bytes = 0
        every = EARLY_FLUSH_CALLERS
        if len(ids) <= every or self._inflight >= len(ids):
            every = 0  # a small wave, or a fed device: one flush after them all is enough
        resumed = 0
        for single_id, result in zip(ids, results, strict=True):
            future, file, op, _, _, _, _ = recs.pop(single_id)
            if not future.done():  # a cancelled caller: the I/O still ran to completion
                future.set_result(result)  # its wake-up goes to the loop's ready queue
                resumed += 1
                if resumed == every:
                    resumed = 0
                    self._loop.call_soon(self._flush)  # type: ignore[attr-defined]
                    self._flush_scheduled = True
            file.inflight -= 1
            if not file.inflight:
                wake_all(file._drained)
            if op == READ:
                read_bytes += result
            else:
                written_bytes += result
        n = len(ids)
        counters = self.counters
        counters["bytes_read"] += read_bytes
        counters["bytes_written"] += written_bytes
        counters["batches"] += n
        counters["requests"] += n
        self._inflight_batches -= n
        if not self._inflight_batches:
            wake_all(self._drained)

    def _single_unusual(self, slot: int, result: int) -> None:
        """An error, EOF, short transfer or EAGAIN of a single: as ``_handle_unusual`` does."""
        single_id = int(self._slot_row[slot])
        rec = _Single(*self._single_recs[single_id])
        done = int(self._slot_done[slot])
        error = None
        if result < 0 and -result in _RETRY:
            return self._resubmit_single(slot, rec, done)
        if result < 0:
            error = error_from_errno(-result, rec.file.path, rec.offset + done)
        else:
            done += result
            if result == 0 and rec.op == WRITE:
                error = error_from_errno(errno.EIO, rec.file.path, rec.offset + done)
            elif (
                result
                and done < rec.length
                and not (rec.file.direct and done % rec.file.alignment_bytes)
            ):
                self.counters["short_transfers_resumed"] += 1
                return self._resubmit_single(slot, rec, done)
        del self._single_recs[single_id]
        self._release_slot(slot)  # type: ignore[attr-defined]
        self._single_done(rec, done, error)
        return None

    def _resubmit_single(self, slot: int, rec: _Single, done: int) -> None:
        if done and not self._slot_done[slot]:
            self._resumed += 1
        self._inflight -= 1
        address, length = rec.address + done, rec.length - done
        word0, word5 = self._single_words(rec, address, length)
        self._push(  # type: ignore[attr-defined]
            word0, rec.offset + done, address, length, np.array([slot], np.intp), word5,
            length, done,
        )  # fmt: skip

    def _single_done(self, rec: _Single, result: int, error: BaseException | None) -> None:
        """What ``IOEngine._complete`` does for a batch, for one request."""
        future = rec.future
        if not future.done():  # a cancelled caller: the I/O still ran to completion
            if error is None:
                future.set_result(result)
            else:
                if hasattr(error, "batch_results"):
                    error.batch_results = [error]
                future.set_exception(error)
        self._settle(rec.file, 1)
        self._settle_batch(1)
        counters = self.counters
        counters["bytes_read" if rec.op == READ else "bytes_written"] += result
        counters["errors"] += error is not None
