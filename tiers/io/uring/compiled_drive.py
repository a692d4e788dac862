"""CompiledDriver: UringEngine's ``_drive`` when the numba loop (``reap_loop``) is available.

The engine's Python path pays its per-wave numpy calls between a completion and the refill of
its slot; here ``reap_loop.run_batch`` does reap, record and refill in machine code and, while
the head batch still has rows to submit, waits for completions inside ``io_uring_enter`` (GIL
released) instead of going back to the event loop for an eventfd wakeup. Python keeps everything
rare or per batch: singles and non-uniform batches are written by the engine's own ``_fill*``,
unusual completions by ``_handle_unusual``, finished batches by ``_account``.

The head batch is handed to the loop even when no slot is free (it then waits for a completion
and refills from it at once): otherwise the wave that finishes a batch would be reaped by a call
with nothing to refill from, and the freed slots would sit idle while Python runs.

The event loop is not starved: the loop returns to it as soon as a batch (or a single) finishes,
so its caller can queue more, and after ``budget`` completions at most (about 3 ms of I/O at
4 KiB QD32; 64 cost 15% of the IOPS in yields), the rest continued by a ``call_soon``.

Concurrency: loop-thread only, like the engine. Invariants: between calls the engine's own
counters (``_nfree``, ``_inflight``, ``_resumed``, the ring tail) are the truth; they are copied
into ``state`` before each compiled call and back after it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from tiers.io.batch import READ, WRITE, IOBatch
from tiers.io.uring import abi
from tiers.io.uring.ring import Ring
from tiers.io.uring.singles import SINGLE_KEY, single_word0

if TYPE_CHECKING:
    from tiers.io.uring.engine import UringEngine

__all__ = ["CompiledDriver", "uniform"]

log = logging.getLogger("tierkit.tiers")
DISABLE_ENV = "TIERKIT_URING_COMPILED"  # "0": the Python path only
_loaded: list[Any] = []  # [run_batch or None], once per process


def uniform(batch: IOBatch, buf_starts: list[int]) -> bool:
    """True for the batches the compiled loop fills: one op (read or write), one file, and no
    registered buffers to look up (those take the Python ``_push_batch``)."""
    return batch.file is not None and (batch.op == READ or batch.op == WRITE) and not buf_starts


def _load() -> Any:
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    if not _loaded:
        try:
            from tiers.io.uring import reap_loop

            _warm_up(reap_loop)
            _loaded.append(reap_loop)
        except Exception as exc:  # no numba, or it failed: the Python path does the same work
            log.info("io_uring compiled loop unavailable, using the Python path: %r", exc)
            _loaded.append(None)
    return _loaded[0]


def _warm_up(reap_loop: Any) -> None:
    """Compile (or load from numba's cache) with the real argument types, on a bad descriptor,
    so a failure shows here and not in the middle of I/O."""
    u32, i64 = np.zeros(1, np.uint32), np.zeros(8, np.int64)
    words, cqes = np.zeros((4, 8), np.uint64), np.zeros((4, 2), np.uint64)
    state = np.zeros(reap_loop.STATE_SIZE, np.int64)
    status = reap_loop.run_batch(
        -1, u32, u32, 3, words, u32, u32, 3, cqes,
        i64, i64, i64, i64, i64.astype(np.intp), i64,
        1, 0, 0, i64, np.zeros(8, np.uint64), i64, 0, 0,
        i64, i64, i64, i64, i64, i64, state, 1, False,
    )  # fmt: skip
    if status != reap_loop.ENTER_FAILED:
        raise RuntimeError("the compiled loop's warm-up did not reach the kernel")


class CompiledDriver:
    def __init__(self, engine: UringEngine, ring: Ring, reap_loop: Any) -> None:
        self.engine = engine
        self.ring = ring
        self.loop = reap_loop
        size = max(4 * engine.queue_depth, 1024) + ring.cq_entries
        self.out = [np.zeros(size, np.int64) for _ in range(4)]  # key, row, result, slot
        self.odd = [np.zeros(ring.cq_entries, np.int64) for _ in range(2)]  # slot, result
        self.state = np.zeros(reap_loop.STATE_SIZE, np.int64)
        self.budget = max(8 * engine.queue_depth, 256)  # completions between yields
        self.empty_i64 = np.zeros(0, np.int64)
        self.empty_u64 = np.zeros(0, np.uint64)

    @classmethod
    def create(cls, engine: UringEngine, ring: Ring) -> CompiledDriver | None:
        reap_loop = _load()
        return None if reap_loop is None else cls(engine, ring, reap_loop)

    def drive(self, woken: bool) -> None:
        """The engine's ``_drive``: submit, reap, refill until quiet (or until yielding)."""
        engine = self.engine
        reaped = woken
        while True:
            singles_got = None  # the singles call's "anything completed", when it ran
            if engine._q_offsets:
                if engine._q_uniform:  # the common case: the loop writes them (see singles)
                    singles_got, yielded = self._call(self._singles_source(), None)
                    if yielded:
                        self._yield(singles_got)
                        return
                else:
                    engine._fill_singles()
            tail = self.ring._tail
            engine._fill(stop_at_uniform=True)
            # the head batch goes in even with no slot free: the loop then reaps and refills
            # from it in one pass, so the slots a finishing batch frees never sit idle
            entry = engine._pending[0] if engine._pending else None
            if entry is not None and not uniform(entry[0], engine._buf_starts_list):
                entry = None  # the Python ``_fill`` writes it, as slots free up
            if entry is None and singles_got is not None and self.ring._tail == tail:
                got, yielded = singles_got, False  # that call submitted and reaped all there was
            else:
                source = None if entry is None else self._batch_source(entry)
                got, yielded = self._call(source, entry)
            if yielded:
                self._yield(got)  # the rest after the callers that can now run
                return
            if got:
                reaped = True
                continue
            singles_wait = bool(engine._q_offsets) and engine._q_uniform
            if (entry is not None or singles_wait) and (engine._pending or singles_wait):
                continue  # rows or singles wait for slots, or another batch: on to the next
            # a call that submitted and reaped nothing needs no second look: its enter ran the
            # deferred completions, and any later one signals the eventfd
            if not reaped:
                return
            # Quiet now: clear the eventfd, then look once more (see the Python path).
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(engine._eventfd)
            reaped = False

    def _yield(self, reaped: bool) -> None:
        """Go back to the event loop; the flush scheduled here goes on after the callers run.

        A call that reaped posted CQEs, which signalled the eventfd: cleared here, or the next
        loop pass would wake ``_on_wakeup`` for two calls that find nothing. A completion whose
        signal this clear consumed is reaped by the flush's first call (every drive enters the
        kernel at least once); one that comes later signals the eventfd again.
        """
        if reaped:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self.engine._eventfd)
        self.engine._schedule_flush()

    @staticmethod
    def _batch_source(entry: list[Any]) -> tuple[Any, ...]:
        """What ``run_batch`` needs of a uniform batch: key, row base, first row, rows, offsets,
        addresses, lengths, SQE word 0."""
        batch, first_row, key = entry
        opcode = abi.OP_READ if batch.op == READ else abi.OP_WRITE
        word0 = single_word0(batch.file, opcode)
        return key, 0, first_row, len(batch), batch.offsets, batch.addresses, batch.lengths, word0

    def _singles_source(self) -> tuple[Any, ...]:
        """The engine's queue of uniform single requests as one batch (ids as rows)."""
        engine = self.engine
        n = len(engine._q_offsets)
        assert engine._q_file is not None
        opcode = abi.OP_READ if engine._q_op == READ else abi.OP_WRITE
        return (
            SINGLE_KEY, engine._next_single_id - n, 0, n,
            np.array(engine._q_offsets, np.int64), np.array(engine._q_addresses, np.uint64),
            np.array(engine._q_lengths, np.int64), single_word0(engine._q_file, opcode),
        )  # fmt: skip

    def _call(self, source: tuple[Any, ...] | None, entry: list[Any] | None) -> tuple[bool, bool]:
        """One compiled call, filling from ``source`` (a uniform batch ``entry`` or the queue of
        singles) if any; returns (anything completed, the event loop should run now: a caller
        can go on, the budget is spent, or the kernel is short of resources)."""
        engine, ring, state = self.engine, self.ring, self.state
        out_key, out_row, out_res, out_slot = self.out
        odd_slot, odd_res = self.odd
        if source is not None:
            key, row_base, first_row, n_rows, offsets, addresses, lengths, word0 = source
        else:
            key, row_base, first_row, word0, n_rows = 0, 0, 0, 0, 0
            offsets, addresses, lengths = self.empty_i64, self.empty_u64, self.empty_i64
        state[:] = (ring._tail, engine._nfree, first_row, 0, 0, engine._inflight, engine._resumed)
        status = self.loop.run_batch(
            ring.fd, ring._sq_head, ring._sq_tail, ring._sq_mask, ring._words,
            ring._cq_head, ring._cq_tail, ring._cq_mask, ring._cqes,
            engine._slot_key, engine._slot_row, engine._slot_len, engine._slot_done,
            engine._free, engine._left,
            key, row_base, n_rows, offsets, addresses, lengths, word0, 0,
            out_key, out_row, out_res, out_slot, odd_slot, odd_res,
            state, self.budget, source is not None,
        )  # fmt: skip
        tail, nfree, row, nout, nodd, inflight, resumed = state.tolist()
        ring._tail, engine._nfree, engine._inflight, engine._resumed = (
            tail,
            nfree,
            inflight,
            resumed,
        )
        if entry is not None:
            entry[1] = row
            if row == n_rows:
                engine._pending.popleft()
        elif source is not None and row:
            engine._dequeue_singles(row - first_row)
        if engine._watchdog is None and inflight:
            engine._arm_watchdog()
        failed = status == self.loop.ENTER_FAILED
        if failed:
            engine._enter()  # raises the errno, or leaves EAGAIN/EBUSY to the next completion
        if nout:
            engine.counters["completion_waves"] += 1
            self._record(nout)
        if nodd:
            engine._handle_unusual(odd_slot[:nodd].copy(), odd_res[:nodd].copy())
        finished = bool(nout) and self._finished
        busy = source is not None and nout >= self.budget
        return bool(nout or nodd), finished or busy or failed

    def _record(self, n: int) -> None:
        engine = self.engine
        out_key, out_row, out_res = self.out[:3]
        keys, rows, res = out_key[:n], out_row[:n], out_res[:n]
        before = engine._inflight_batches
        first = int(keys[0])
        # singles: a list's any() for a wave of a few, not a numpy reduction (~1.5 us a call)
        if first == SINGLE_KEY and not (any(keys.tolist()) if n < 64 else keys.any()):
            engine._settle_singles(rows.tolist(), res.tolist())
        elif first == int(keys[-1]) and (n < 3 or bool((keys == first).all())):
            engine._account(first, rows.copy(), res.copy(), counted=True)
        else:
            for key in np.unique(keys).tolist():
                mine = keys == key
                engine._account(key, rows[mine], res[mine], counted=True)
        self._finished = engine._inflight_batches != before

    _finished = False
