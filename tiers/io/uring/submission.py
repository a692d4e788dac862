"""SubmissionMixin: UringEngine's batches turned into SQEs, written in vectorised numpy steps.

``_fill`` moves rows of pending batches into free slots; ``_push_batch`` builds the SQE words of
many rows at once (one numpy call per word, registered buffers and per-row files included);
``_push`` writes them to the ring and records what each slot asked for. The compiled loop
(``reap_loop``) fills uniform batches itself; this is the path for everything else, for resumed
short transfers, and for the whole engine when numba is unavailable.

Concurrency: loop-thread only (the ring is SINGLE_ISSUER). Invariants: a slot's ``_slot_len`` and
``_slot_done`` are written only after its SQE is in the ring, so a failed push leaves no trace;
``_inflight`` counts every SQE written and not yet completed.
"""

from __future__ import annotations

import asyncio
import errno
from collections import deque
from typing import Any

import numpy as np

from tiers.io.batch import FDATASYNC, IOBatch
from tiers.io.uring import abi
from tiers.io.uring.compiled_drive import uniform
from tiers.io.uring.ring import Ring
from tiers.io.uring.singles import SinglesMixin

__all__ = ["SubmissionMixin"]

_OPCODE = np.array([abi.OP_READ, abi.OP_WRITE, abi.OP_FSYNC, abi.OP_FSYNC], np.uint8)
_FIXED_OPCODE = np.array(
    [abi.OP_READ_FIXED, abi.OP_WRITE_FIXED, abi.OP_FSYNC, abi.OP_FSYNC], np.uint8
)
_RW_FLAGS = np.array([0, 0, 0, abi.FSYNC_DATASYNC], np.uint32)
WATCHDOG_S = 0.25


class SubmissionMixin(SinglesMixin):
    """SQE building for UringEngine, which owns the ring and the slot tables."""

    _ring: Ring | None
    _pending: deque[list[Any]]
    _slot_len: np.ndarray
    _rows: np.ndarray
    _buf_starts: np.ndarray
    _watchdog: asyncio.TimerHandle | None

    def _on_watchdog(self) -> None:
        raise NotImplementedError  # UringEngine's

    def _fill(self, stop_at_uniform: bool = False) -> None:
        """Move pending rows into free slots (their SQEs are submitted by the next enter);
        with ``stop_at_uniform``, only until a batch the compiled loop can fill comes first."""
        while self._pending and self._nfree:
            entry = self._pending[0]
            batch, first_row, key = entry
            if stop_at_uniform and uniform(batch, self._buf_starts_list):
                return
            take = min(len(batch) - first_row, self._nfree)
            end_row = first_row + take
            slots = self._free[self._nfree - take : self._nfree].copy()
            rows = (
                self._rows[first_row:end_row]
                if end_row <= len(self._rows)
                else np.arange(first_row, end_row)
            )
            self._push_batch(batch, slots, slice(first_row, end_row), 0)  # may raise
            self._nfree -= take
            self._slot_key[slots] = key
            self._slot_row[slots] = rows
            if end_row == len(batch):
                self._pending.popleft()
            else:
                entry[1] = end_row

    def _push_batch(
        self, batch: IOBatch, slots: np.ndarray, rows: slice | np.ndarray, done: np.ndarray | int
    ) -> None:
        """Fill SQEs for ``rows`` of ``batch`` (resuming ``done`` bytes into each) in ``slots``."""
        lengths = batch.lengths[rows]
        addresses = batch.addresses[rows]
        offsets = batch.offsets[rows]
        if done:  # resuming a short transfer
            lengths, offsets = lengths - done, offsets + done
            addresses = addresses + np.uint64(done)
        op = batch.op
        if op >= 0:
            opcode: np.ndarray | int = int(_OPCODE[op])
            word3: np.ndarray | int = lengths if op != FDATASYNC else abi.FSYNC_DATASYNC << 32
        else:
            ops = batch.ops[rows]
            opcode = _OPCODE[ops].astype(np.uint64)
            word3 = lengths.astype(np.uint64) | (_RW_FLAGS[ops].astype(np.uint64) << 32)
        buf_index: np.ndarray | int = 0
        if len(self._buf_starts):
            k = np.searchsorted(self._buf_starts, addresses, side="right") - 1
            k0 = np.maximum(k, 0)
            inside = (k >= 0) & (addresses + lengths.astype(np.uint64) <= self._buf_ends[k0])
            ops = batch.ops[rows]
            opcode = np.where(inside, _FIXED_OPCODE[ops], _OPCODE[ops]).astype(np.uint64)
            buf_index = k0.astype(np.uint64)
        file = batch.file
        if file is not None:
            fd, flags = (file.slot, abi.SQE_FIXED_FILE) if file.slot >= 0 else (file.fd, 0)
            fd_word: np.ndarray | int = ((fd & 0xFFFFFFFF) << 32) | (flags << 8)
        else:
            files = (
                batch.files[rows]
                if isinstance(rows, slice)
                else [batch.files[r] for r in rows.tolist()]
            )
            fd_word = np.array(
                [
                    ((f.slot if f.slot >= 0 else f.fd) << 32)
                    | ((abi.SQE_FIXED_FILE if f.slot >= 0 else 0) << 8)
                    for f in files
                ],
                np.uint64,
            )
        word0 = (
            opcode | fd_word
            if isinstance(opcode, int) and isinstance(fd_word, int)
            else np.bitwise_or(opcode, fd_word, dtype=np.uint64)
        )
        self._push(word0, offsets, addresses, word3, slots, buf_index, lengths, done)

    def _push(
        self,
        word0: np.ndarray | int,
        offsets: np.ndarray | int,
        addresses: np.ndarray | int,
        word3: np.ndarray | int,
        slots: np.ndarray,
        word5: np.ndarray | int,
        lengths: np.ndarray | int,
        done: np.ndarray | int,
    ) -> None:
        """Write SQEs (words as in ``Ring.push``) for ``slots``, asking ``lengths`` bytes each,
        ``done`` bytes of each already moved; counted in flight."""
        assert self._ring is not None
        self._ring.push(word0, offsets, addresses, word3, slots, word5)
        self._slot_len[slots] = lengths  # only now: a failure above leaves no trace
        self._slot_done[slots] = done
        self._inflight += len(slots)
        if self._watchdog is None:
            self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        self._watchdog = self._loop.call_later(WATCHDOG_S, self._on_watchdog)

    def _enter(self) -> None:
        assert self._ring is not None
        try:
            self._ring.enter()
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EBUSY):
                raise
            # the kernel is short of resources: unsubmitted SQEs stay queued and the next
            # completion (or the watchdog) submits them
