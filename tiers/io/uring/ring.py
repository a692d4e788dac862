"""Ring: one io_uring instance, its rings mapped with mmap and viewed as numpy arrays.

A batch of submission entries is written field by field with numpy slice assignment (one call
per field per batch, not per I/O); completions are harvested as numpy arrays.

Memory ordering: the rings are shared with the kernel without SQPOLL, so the kernel reads new
SQEs only inside our own ``io_uring_enter`` call (program order suffices to publish them). With
``IORING_SETUP_DEFER_TASKRUN`` (Linux 6.1+) the kernel also posts CQEs only inside our own
``io_uring_enter(GETEVENTS)``, so reading them after it returns is ordered on any CPU. Without
that flag CQEs may be posted from another CPU at any time; x86-64's total store order keeps the
tail-then-entries reads correct, but a weakly ordered CPU (arm64) would need an acquire barrier
that Python cannot issue, so there the ring refuses to start (the engine then falls back).

Concurrency: single-threaded; created, used and closed by one thread (SINGLE_ISSUER). Closing
waits for the kernel's teardown notification to reach that thread (see ``ring_exit``), so it does
not cut short the thread's next blocking write.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
import threading

import numpy as np

from tiers.io.env import Env
from tiers.io.errors import EngineUnavailableError
from tiers.io.uring import abi
from tiers.io.uring.ring_exit import wait_for_ring_exit

__all__ = ["Ring"]

_STRONGLY_ORDERED = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686"}
_FLAG_SETS = (
    abi.SETUP_SUBMIT_ALL | abi.SETUP_SINGLE_ISSUER | abi.SETUP_DEFER_TASKRUN,
    abi.SETUP_SUBMIT_ALL | abi.SETUP_COOP_TASKRUN,
    abi.SETUP_SUBMIT_ALL,
    0,
)
_SQE_FIELDS = ("opcode", "flags", "fd", "off", "addr", "len", "rw_flags", "user_data", "buf_index")


class Ring:
    """An io_uring with at least ``entries`` SQ slots and a CQ twice that size."""

    def __init__(self, entries: int, env: Env) -> None:
        self._creator_thread_id = threading.get_native_id()
        self.fd, params = self._setup(entries, env)
        try:
            self._map(params)
        except BaseException:
            os.close(self.fd)
            wait_for_ring_exit()
            raise

    def _setup(self, entries: int, env: Env) -> tuple[int, abi.Params]:
        last: OSError | None = None
        for flags in _FLAG_SETS:
            params = abi.Params()
            params.flags = flags | abi.SETUP_CQSIZE | abi.SETUP_CLAMP
            params.cq_entries = 2 * entries
            try:
                fd = env.io_uring_setup(entries, ctypes.addressof(params))
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # EPERM, ENOSYS, ENOMEM: io_uring is off here
                    raise EngineUnavailableError("io_uring", f"io_uring_setup: {exc}") from exc
                last = exc
                continue
            self.deferred_taskrun = bool(flags & abi.SETUP_DEFER_TASKRUN)
            if not self.deferred_taskrun and not _STRONGLY_ORDERED:
                os.close(fd)
                raise EngineUnavailableError(
                    "io_uring",
                    f"{platform.machine()} needs DEFER_TASKRUN (Linux 6.1+) for "
                    "ordered completions without compiled barriers",
                )
            self.setup_flags = params.flags
            return fd, params
        raise EngineUnavailableError("io_uring", f"io_uring_setup refused every flag set: {last}")

    def _map(self, p: abi.Params) -> None:
        self.sq_entries = p.sq_entries
        self.cq_entries = p.cq_entries
        sq_bytes = p.sq_off.array + p.sq_entries * 4
        cq_bytes = p.cq_off.cqes + p.cq_entries * abi.CQE_DTYPE.itemsize
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        if p.features & abi.FEAT_SINGLE_MMAP:
            self._sq_map = mmap.mmap(
                self.fd, max(sq_bytes, cq_bytes), flags, prot, offset=abi.OFF_SQ_RING
            )
            self._cq_map = self._sq_map
        else:
            self._sq_map = mmap.mmap(self.fd, sq_bytes, flags, prot, offset=abi.OFF_SQ_RING)
            self._cq_map = mmap.mmap(self.fd, cq_bytes, flags, prot, offset=abi.OFF_CQ_RING)
        self._sqe_map = mmap.mmap(self.fd, p.sq_entries * 64, flags, prot, offset=abi.OFF_SQES)

        def u32(buf: mmap.mmap, offset: int, count: int = 1) -> np.ndarray:
            return np.frombuffer(buf, np.uint32, count, offset)

        self._sq_head = u32(self._sq_map, p.sq_off.head)
        self._sq_tail = u32(self._sq_map, p.sq_off.tail)
        self._sq_mask = int(u32(self._sq_map, p.sq_off.ring_mask)[0])
        u32(self._sq_map, p.sq_off.array, p.sq_entries)[:] = np.arange(p.sq_entries)
        self._cq_head = u32(self._cq_map, p.cq_off.head)
        self._cq_tail = u32(self._cq_map, p.cq_off.tail)
        self._cq_mask = int(u32(self._cq_map, p.cq_off.ring_mask)[0])
        # SQEs as 8 little-endian u64 words each (see the layout in _uring_abi): a batch is
        # written as whole columns, one numpy call per word instead of per field.
        self._words = np.frombuffer(self._sqe_map, np.uint64).reshape(p.sq_entries, 8)
        self._words[:] = 0
        cq_words = p.cq_entries * abi.CQE_DTYPE.itemsize // 8
        self._cqes = np.frombuffer(self._cq_map, np.uint64, cq_words, p.cq_off.cqes).reshape(-1, 2)
        self._tail = int(self._sq_tail[0])

    # ------------------------------------------------------------------ submission
    def sq_space(self) -> int:
        return self.sq_entries - ((self._tail - int(self._sq_head[0])) & 0xFFFFFFFF)

    def unsubmitted(self) -> int:
        return (self._tail - int(self._sq_head[0])) & 0xFFFFFFFF

    def push(
        self,
        word0: np.ndarray | int,
        off: np.ndarray | int,
        addr: np.ndarray | int,
        word3: np.ndarray | int,
        user_data: np.ndarray,
        word5: np.ndarray | int,
    ) -> None:
        """Append ``len(user_data)`` SQEs, each given as its u64 words (arrays or scalars):

        word0 = opcode | flags << 8 | (fd & 0xFFFFFFFF) << 32;  word3 = len | rw_flags << 32;
        word5 = buf_index.  Words 6 and 7 stay zero.  Requires: ``n <= sq_space()``.
        """
        n = len(user_data)
        start = self._tail & self._sq_mask
        first = min(n, self.sq_entries - start)
        words = self._words
        for column, values in (
            (0, word0),
            (1, off),
            (2, addr),
            (3, word3),
            (4, user_data),
            (5, word5),
        ):
            if isinstance(values, np.ndarray) and first < n:
                words[start : start + first, column] = values[:first]
                words[: n - first, column] = values[first:]
            else:
                words[start : start + first, column] = values
                if first < n:
                    words[: n - first, column] = values
        self._tail = (self._tail + n) & 0xFFFFFFFF
        self._sq_tail[0] = self._tail  # published to the kernel by our next io_uring_enter

    def enter(self, min_complete: int = 0, get_events: bool = True) -> int:
        """Submit every queued SQE and run deferred completions; returns SQEs consumed."""
        flags = abi.ENTER_GETEVENTS if get_events else 0
        while True:
            try:
                return abi.io_uring_enter(self.fd, self.unsubmitted(), min_complete, flags)
            except InterruptedError:
                continue

    # ------------------------------------------------------------------ completion
    def reap(self) -> np.ndarray | None:
        """Every posted CQE as a uint64[n, 2] copy (word 0: user_data; the low half of word 1,
        viewed as int32, is ``res``), or None when the queue is empty."""
        head = int(self._cq_head[0])
        tail = int(self._cq_tail[0])
        n = (tail - head) & 0xFFFFFFFF
        if not n:
            return None
        start = head & self._cq_mask
        first = min(n, self.cq_entries - start)
        if first == n:
            cqes = self._cqes[start : start + n].copy()
        else:
            cqes = np.concatenate((self._cqes[start:], self._cqes[: n - first]))
        self._cq_head[0] = tail  # slots free for the kernel only after the copy above
        return cqes

    def reap_ready(self) -> bool:
        return self._cq_head[0] != self._cq_tail[0]

    # ------------------------------------------------------------------ registration
    def register(self, opcode: int, arg_address: int, nr_args: int) -> int:
        return abi.io_uring_register(self.fd, opcode, arg_address, nr_args)

    def close(self) -> None:
        del self._words, self._cqes
        del self._sq_head, self._sq_tail, self._cq_head, self._cq_tail
        for buf in {id(m): m for m in (self._sq_map, self._cq_map, self._sqe_map)}.values():
            buf.close()
        os.close(self.fd)
        if threading.get_native_id() == self._creator_thread_id:
            wait_for_ring_exit()
