"""CompletionMixin: UringEngine's completions turned into results, retries and finished batches.

``_harvest`` (the Python path) reaps every posted CQE as numpy arrays; ordinary completions (the
length asked was moved) go to ``_finish`` in one vectorised step, which refills the freed slots
before it does any bookkeeping, so the device gets new work first. Errors, EOF, short transfers
and EAGAIN are rare and handled one by one in ``_handle_unusual``: short transfers are resumed
from where they stopped, EAGAIN/EINTR retried, errors recorded as typed StorageErrors.
``_account`` records results and completes a batch when its last request finishes.

Concurrency: loop-thread only. Invariants: ``_left[key]`` counts the requests of batch ``key``
not yet finished (``_account`` completes the batch when it reaches 0); ``_resumed`` counts slots
whose ``_slot_done`` is non-zero.
"""

from __future__ import annotations

import errno
from typing import Any

import numpy as np

from tiers.io.batch import READ, IOBatch
from tiers.io.errors import error_from_errno
from tiers.io.uring.singles import SINGLE_KEY
from tiers.io.uring.submission import SubmissionMixin

__all__ = ["CompletionMixin"]

_RETRY = {errno.EAGAIN, errno.EINTR}


class CompletionMixin(SubmissionMixin):
    """Completion handling for UringEngine, which owns the ring and the slot tables."""

    _batches: dict[int, IOBatch]
    _left: np.ndarray
    _free_keys: list[int]
    _q_offsets: list[int]
    counters: dict[str, Any]

    def _harvest(self) -> bool:
        """Process every posted completion; True when there was any."""
        assert self._ring is not None
        reaped = False
        while (cqes := self._ring.reap()) is not None:
            reaped = True
            self.counters["completion_waves"] += 1
            slots = cqes[:, 0].astype(np.intp)
            res = cqes.view(np.int32)[:, 2].astype(np.int64)
            ok = res == self._slot_len[slots]
            if not ok.all():
                self._handle_unusual(slots[~ok], res[~ok])
                slots, res = slots[ok], res[ok]
            if len(slots):
                if self._resumed:
                    res += self._slot_done[slots]
                self._finish(slots, res, refill=True)
        return reaped

    def _handle_unusual(self, slots: np.ndarray, res: np.ndarray) -> None:
        """Errors, EOF and short transfers: rare, so handled one by one."""
        for slot, result in zip(slots.tolist(), res.tolist(), strict=True):
            key = int(self._slot_key[slot])
            if key == SINGLE_KEY:
                self._single_unusual(slot, result)
                continue
            batch = self._batches[key]
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
            is_read = batch.ops[row] == READ
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
        if done and not self._slot_done[slot]:
            self._resumed += 1
        self._inflight -= 1
        self._push_batch(batch, np.array([slot], np.intp), np.array([row]), done)

    def _release_slot(self, slot: int) -> None:
        """Free the slot of a single that finished unusually (errors, EOF)."""
        self._inflight -= 1
        if self._slot_done[slot]:
            self._resumed -= 1
        self._free[self._nfree] = slot
        self._nfree += 1

    def _finish_one(self, slot: int, done: int) -> None:
        self._finish(np.array([slot], np.intp), np.array([done], np.int64))

    def _finish(self, slots: np.ndarray, done: np.ndarray, refill: bool = False) -> None:
        """Free the slots of finished requests, refill them (``refill``: the device gets new
        work before we do the bookkeeping), then record results and complete whole batches."""
        n = len(slots)
        self._inflight -= n
        if self._resumed:
            self._resumed -= int(np.count_nonzero(self._slot_done[slots]))
        bids = self._slot_key[slots]
        rows = self._slot_row[slots]
        self._free[self._nfree : self._nfree + n] = slots
        self._nfree += n
        if refill and (self._pending or self._q_offsets):
            self._fill_singles()
            self._fill()
            self._enter()
        if bids[0] == bids[-1] and (n < 3 or (bids == bids[0]).all()):
            self._account(int(bids[0]), rows, done)
            return
        for bid in np.unique(bids).tolist():
            mine = bids == bid
            self._account(bid, rows[mine], done[mine])

    def _account(self, key: int, rows: np.ndarray, done: np.ndarray, counted: bool = False) -> None:
        """Record results of finished rows; ``counted``: ``_left`` already dropped for them."""
        if key == SINGLE_KEY:
            self._settle_singles(rows.tolist(), done.tolist())
            return
        batch = self._batches[key]
        batch.results[rows] = done
        if not counted:
            self._left[key] -= len(rows)
        if not self._left[key]:
            del self._batches[key]
            self._free_keys.append(key)
            self._complete(batch)
