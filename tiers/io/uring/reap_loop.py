"""A compiled reap-and-refill loop for UringEngine: numba, compiled on first use, cached on disk.

Why: in Python every completion wave pays a dozen numpy calls (~50-100 us) before the freed
slots are refilled, so at 4 KiB QD32 a quarter of the slots sit idle and the device sees QD24.
This loop reaps CQEs, records their results and writes the next SQEs straight into the mapped
rings, and waits in ``io_uring_enter(GETEVENTS, min_complete)`` with the GIL released while the
current batch still has rows to submit, as fio does (for a quarter of the requests in flight, not
the first). No C compiler: numba emits the machine code, and libc's ``syscall`` is called by name
(resolved in this process), which keeps ``cache=True`` possible (a ctypes pointer would bake an
address into the cached code).

Contract of :func:`run_batch` (all arrays are the engine's, shared by reference):

* refills free slots from rows ``state[ROW]`` .. ``n_rows - 1`` of one uniform batch (one opcode,
  one file: ``word0``; ``word3_hi`` holds rw_flags << 32), tagging each slot with ``key`` and
  row ``row_base + row`` (the engine's queue of single requests passes its first id there);
* a CQE whose result equals the length asked is *ordinary*: its ``(key, row, result, slot)`` go to
  the ``out_*`` arrays, ``left[key]`` drops by one and the slot is freed at once;
* ``state[RESUMED]`` counts slots resuming a short transfer; it drops as they finish;
* any other CQE (error, EOF, short, EAGAIN) is *unusual*: its slot and result go to ``odd_*``, the
  slot stays owned, and the loop stops so Python can handle it;
* it stops after a wave in which some ``left[key]`` reached 0 (a batch finished: its caller should
  run) or a single request (key ``SINGLE_KEY``) finished, after ``budget`` completions (the event
  loop must breathe), when the batch has no rows left, when nothing completed and ``wait`` is
  false, or when ``io_uring_enter`` fails (status ``ENTER_FAILED``: Python repeats the call to
  read errno); before it stops it refills the slots the last wave freed and submits them (no
  wait), so the device stays fed while Python runs.

Concurrency: called only from the ring's thread (the ring is SINGLE_ISSUER); ``nogil``.
Invariants: ``state`` = [sq tail, free slots, next row, out count, odd count, in flight, resumed].
Memory order: as in ``ring``: the kernel reads SQEs and posts CQEs only inside our enter.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, types

__all__ = ["ENTER_FAILED", "INFLIGHT", "NFREE", "NODD", "NOUT", "RESUMED", "ROW", "STATE_SIZE"]
__all__ += ["SINGLE_KEY", "TAIL"]
__all__ += ["run_batch"]

TAIL, NFREE, ROW, NOUT, NODD, INFLIGHT, RESUMED = range(7)
STATE_SIZE = 7
ENTER_FAILED = -1
SINGLE_KEY = 0  # as in ``singles``: every completion of this key is a caller that can run
_SYS_IO_URING_ENTER = 426
_GETEVENTS = 1
_MASK32 = 0xFFFFFFFF
# syscall(2) by name: the JIT resolves it in this process's libc (see abi: varargs are ints)
_syscall = types.ExternalFunction("syscall", types.int64(*([types.int64] * 7)))


@njit(nogil=True, cache=True, inline="always")
def _put(words: Any, i: int, word0: int, offset: int, address: int, length: int, word3_hi: int,
         slot: int) -> None:  # fmt: skip
    words[i, 0] = word0
    words[i, 1] = offset
    words[i, 2] = address
    words[i, 3] = length | word3_hi
    words[i, 4] = slot
    words[i, 5] = 0


@njit(nogil=True, cache=True)
def run_batch(
    ring_fd: int, sq_head: Any, sq_tail: Any, sq_mask: int, words: Any,
    cq_head: Any, cq_tail: Any, cq_mask: int, cqes: Any,
    slot_key: Any, slot_row: Any, slot_len: Any, slot_done: Any, free: Any, left: Any,
    key: int, row_base: int, n_rows: int, offsets: Any, addresses: Any, lengths: Any,
    word0: int, word3_hi: int,
    out_key: Any, out_row: Any, out_res: Any, out_slot: Any, odd_slot: Any, odd_res: Any,
    state: Any, budget: int, wait: bool,
) -> int:  # fmt: skip
    tail, nfree, row, inflight, resumed = state[0], state[1], state[2], state[5], state[6]
    nout, nodd, reaped = 0, 0, 0
    room = len(out_key) - len(cqes)  # a wave can never overflow the out arrays
    status = 0
    stop = False
    while True:
        # refill before any bookkeeping (device first); also right before stopping: Python is
        # about to run (callers, bookkeeping: tens of microseconds) and the slots the last wave
        # freed should hold work meanwhile, not sit idle until the next call
        while nfree > 0 and row < n_rows:
            nfree -= 1
            slot = free[nfree]
            length = lengths[row]
            _put(words, tail & sq_mask, word0, offsets[row], addresses[row], length, word3_hi, slot)
            slot_key[slot] = key
            slot_row[slot] = row_base + row
            slot_len[slot] = length
            slot_done[slot] = 0
            tail = (tail + 1) & _MASK32
            row += 1
            inflight += 1
        sq_tail[0] = tail
        unsubmitted = (tail - np.int64(sq_head[0])) & _MASK32
        if stop:
            if unsubmitted and _syscall(_SYS_IO_URING_ENTER, ring_fd, unsubmitted, 0, 0, 0, 0) < 0:  # type: ignore[call-overload]
                status = ENTER_FAILED
            break
        # wait for a quarter of the requests in flight (at least one), not for the first: one
        # wake-up then refills several slots in one enter (at 4 KiB QD32, in-process A/Bs of
        # 2026-11-27: 4 at a time +6% reads/s over 1, 8 at a time +6% over 4 and less CPU)
        min_complete = max(1, inflight >> 2) if wait and row < n_rows and inflight > 0 else 0
        rc = _syscall(_SYS_IO_URING_ENTER, ring_fd, unsubmitted, min_complete, _GETEVENTS, 0, 0)  # type: ignore[call-overload]
        if rc < 0:
            status = ENTER_FAILED
            break
        head, end = np.int64(cq_head[0]), np.int64(cq_tail[0])
        finished = False
        n = 0
        while head != end:
            e = head & cq_mask
            slot = np.int64(cqes[e, 0])
            res = np.int64(cqes[e, 1] & np.uint64(_MASK32))
            if res >= 1 << 31:  # ``res`` is an s32
                res -= 1 << 32
            head = (head + 1) & _MASK32
            n += 1
            if res == slot_len[slot]:
                k = slot_key[slot]
                out_key[nout] = k
                out_row[nout] = slot_row[slot]
                out_res[nout] = res + slot_done[slot]
                if slot_done[slot]:
                    resumed -= 1
                out_slot[nout] = slot
                nout += 1
                left[k] -= 1
                finished |= left[k] == 0 or k == SINGLE_KEY
                free[nfree] = slot
                nfree += 1
                inflight -= 1
            else:
                odd_slot[nodd] = slot
                odd_res[nodd] = res
                nodd += 1
        cq_head[0] = head  # the CQ slots go back to the kernel only after the reads above
        reaped += n
        stop = finished or nodd > 0 or nout > room or reaped >= budget or row >= n_rows
        stop |= n == 0 and not wait
    state[0], state[1], state[2], state[3], state[4], state[5], state[6] = (
        tail, nfree, row, nout, nodd, inflight, resumed,
    )  # fmt: skip
    return status
