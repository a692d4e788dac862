"""Single ``read_into``/``write_from`` calls on UringEngine, gathered into shared submissions.

Why: 32 tasks each awaiting one 4 KiB read used to build 32 IOBatch objects (numpy arrays,
validation, a dict entry) and paid ~47 us of CPU per read. Here a call is one small record on a
queue; every call made in the same loop iteration is written to the ring by the one ``_flush``
that the first of them scheduled, and each completion resolves its record's future directly.

Requests the light checks cannot vouch for (a negative offset, a misaligned O_DIRECT request, a
read-only file written) take the general path, which raises the same typed errors as before.

Concurrency: loop-thread only, like the rest of the engine. Invariants: a record is in exactly
one of ``_singles`` (queued), ``_single_recs`` (in flight, keyed by the id held in its slot's
row) or nowhere (finished); key 0 of the slot table marks slots that hold a single.
"""

from __future__ import annotations

import bisect
import errno
from collections import deque
from typing import Any

import numpy as np

from tiers.io.batch import READ, WRITE
from tiers.io.buffers import as_buffer
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import error_from_errno
from tiers.io.uring import abi

__all__ = ["SINGLE_KEY", "SinglesMixin"]

SINGLE_KEY = 0
_MAX_REQUEST_BYTES = 0x7FFFF000
_RETRY = {errno.EAGAIN, errno.EINTR}


class _Single:
    __slots__ = ("address", "file", "future", "length", "offset", "op", "owner")

    def __init__(self, future: Any, file: FileHandle, op: int, offset: int, ref: Any) -> None:
        self.future = future
        self.file = file
        self.op = op
        self.offset = offset
        self.address = ref.address
        self.length = ref.size_bytes
        self.owner = ref.owner  # the caller's buffer stays alive while the kernel may write it


class SinglesMixin(IOEngine):
    """The single-request path; UringEngine supplies the ring, slots and ``_push``."""

    _singles: deque[_Single]
    _single_recs: dict[int, _Single]
    _next_single_id: int
    _buf_starts_list: list[int]
    _buf_ends: np.ndarray
    _free: np.ndarray
    _nfree: int
    _inflight: int
    _resumed: int
    _slot_key: np.ndarray
    _slot_row: np.ndarray
    _slot_done: np.ndarray
    _loop: Any

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
        try:
            ref = as_buffer(buffer)
        except Exception:
            return None  # the general path raises the typed error
        length = ref.size_bytes
        if length > _MAX_REQUEST_BYTES or (op == READ and not ref.writable):
            return None
        if op == WRITE and not file.writable:
            return None
        if file.direct and (offset | length | ref.address) & (file.alignment_bytes - 1):
            return None
        self._ensure_ring()  # type: ignore[attr-defined]
        future = self._loop.create_future()
        self._singles.append(_Single(future, file, op, offset, ref))
        file.inflight += 1
        self._inflight_batches += 1
        self._schedule_flush()  # type: ignore[attr-defined]
        return future

    def _fill_singles(self) -> None:
        """Write queued singles into free slots: one numpy call per SQE word for all of them."""
        take = min(len(self._singles), self._nfree)
        if not take:
            return
        nfree = self._nfree
        slots = self._free[nfree - take : nfree].copy()
        word0, offsets, addresses, lengths, word5, ids = [], [], [], [], [], []
        recs = self._single_recs
        for _ in range(take):
            rec = self._singles.popleft()
            w0, w5 = self._single_words(rec, rec.address, rec.length)
            word0.append(w0)
            word5.append(w5)
            offsets.append(rec.offset)
            addresses.append(rec.address)
            lengths.append(rec.length)
            ids.append(self._next_single_id)
            recs[self._next_single_id] = rec
            self._next_single_id += 1
        length_array = np.array(lengths, np.int64)
        self._push(  # type: ignore[attr-defined]
            np.array(word0, np.uint64),
            np.array(offsets, np.uint64),
            np.array(addresses, np.uint64),
            length_array,
            slots,
            np.array(word5, np.uint64),
            length_array,
            0,
        )
        self._nfree = nfree - take
        self._slot_key[slots] = SINGLE_KEY
        self._slot_row[slots] = ids

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
        file = rec.file
        if file.slot >= 0:
            return opcode | abi.SQE_FIXED_FILE << 8 | file.slot << 32, buf_index
        return opcode | (file.fd & 0xFFFFFFFF) << 32, buf_index

    def _settle_singles(self, ids: list[int], results: list[int]) -> None:
        recs = self._single_recs
        for single_id, result in zip(ids, results, strict=True):
            self._single_done(recs.pop(single_id), result, None)

    def _single_unusual(self, slot: int, result: int) -> None:
        """An error, EOF, short transfer or EAGAIN of a single: as ``_handle_unusual`` does."""
        single_id = int(self._slot_row[slot])
        rec = self._single_recs[single_id]
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
