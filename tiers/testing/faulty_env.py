"""FaultyEnv: an Env for tests whose OS calls come back short, fail, or refuse io_uring.

Engines reach the kernel through :class:`~tiers.io.env.Env`; swapping in a FaultyEnv drives them
down paths a healthy kernel rarely takes:
  * short transfers: ``preadv``/``pwritev`` move only a prefix of the asked bytes (at least one
    byte, a whole number of pages on an O_DIRECT descriptor), so an engine's resume loop runs;
  * ``OSError`` EIO from ``preadv``/``pwritev``/``fsync``, ENOSPC from ``pwritev``;
  * ``io_uring_setup`` refused with a chosen errno (e.g. EPERM, as under a seccomp filter), to
    check that :func:`tiers.io.factory.create_engine` falls back to the thread engine;
  * EIO from the namespace calls (``listdir``, ``makedirs``, ``unlink``, ``rename``), and a
    directory lock found held by another owner (``lock`` raises BlockingIOError).
Faults come from one-shot triggers (:meth:`FaultyEnv.fail_next`) first, then from rate knobs
drawn from a seeded RNG. It only sees what goes through the Env: the data path of UringEngine is
the kernel ring, so only its set-up can be faulted here (use FaultyEngine for the rest).

Concurrency: methods are called from engine worker threads; triggers, the RNG and ``injected``
are guarded by one lock. Invariants: a short transfer always moves at least one byte (zero would
mean end of file to a reader and a stalled write to a writer).
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from tiers.io.buffers import PAGE_SIZE_BYTES
from tiers.io.env import Env
from tiers.io.errors import InvalidArgumentError

__all__ = ["ENV_FAULT_KINDS", "EnvFaultKind", "FaultyEnv"]

EnvFaultKind = Literal[
    "short_read", "short_write", "eio_read", "eio_write", "enospc", "eio_fsync",
    "eio_namespace", "lock_held",
]  # fmt: skip
ENV_FAULT_KINDS: tuple[str, ...] = (
    "short_read",
    "short_write",
    "eio_read",
    "eio_write",
    "enospc",
    "eio_fsync",
    "eio_namespace",
    "lock_held",
)


class FaultyEnv(Env):
    """An :class:`Env` that injects short transfers, EIO, ENOSPC and a refused io_uring.

    Args:
        seed: seeds the RNG behind the rates and the length of each short transfer.
        short_transfer_rate: probability that a ``preadv``/``pwritev`` call comes back short.
        eio_rate: probability that a ``preadv``/``pwritev`` call fails with EIO.
        enospc_rate: probability that a ``pwritev`` call fails with ENOSPC.
        io_uring_errno: when set, every ``io_uring_setup`` raises ``OSError`` with this errno.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        short_transfer_rate: float = 0.0,
        eio_rate: float = 0.0,
        enospc_rate: float = 0.0,
        io_uring_errno: int | None = None,
    ) -> None:
        for name, rate in (
            ("short_transfer_rate", short_transfer_rate),
            ("eio_rate", eio_rate),
            ("enospc_rate", enospc_rate),
        ):
            if not 0.0 <= rate <= 1.0:
                raise InvalidArgumentError(f"{name} must be in [0, 1], got {rate}")
        self.short_transfer_rate = short_transfer_rate
        self.eio_rate = eio_rate
        self.enospc_rate = enospc_rate
        self.io_uring_errno = io_uring_errno
        self.injected: Counter[str] = Counter()  # faults injected so far, by kind
        self._rng = random.Random(seed)
        self._armed: Counter[str] = Counter()
        self._lock = threading.Lock()

    def fail_next(self, kind: EnvFaultKind, count: int = 1) -> None:
        """Make the next ``count`` matching calls fault: "short_read"/"eio_read" hit ``preadv``,
        "short_write"/"eio_write"/"enospc" hit ``pwritev``, "eio_fsync" hits fsync/fdatasync,
        "eio_namespace" hits listdir/makedirs/unlink/rename, "lock_held" hits ``lock``."""
        if kind not in ENV_FAULT_KINDS:
            raise InvalidArgumentError(
                f"unknown fault kind {kind!r}; choose from {ENV_FAULT_KINDS}"
            )
        if count < 0:
            raise InvalidArgumentError("count must not be negative")
        with self._lock:
            self._armed[kind] += count

    # ----------------------------------------------------------------- data path
    def preadv(self, fd: int, buffers: Sequence[Any], offset_bytes: int) -> int:
        fault = self._draw(("eio_read", "short_read"), errors=((self.eio_rate, "eio_read"),))
        return super().preadv(fd, self._apply(fault, fd, buffers), offset_bytes)

    def pwritev(self, fd: int, buffers: Sequence[Any], offset_bytes: int) -> int:
        fault = self._draw(
            ("enospc", "eio_write", "short_write"),
            errors=((self.enospc_rate, "enospc"), (self.eio_rate, "eio_write")),
        )
        return super().pwritev(fd, self._apply(fault, fd, buffers), offset_bytes)

    def fsync(self, fd: int) -> None:
        self._fail_if_armed("eio_fsync")
        super().fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._fail_if_armed("eio_fsync")
        super().fdatasync(fd)

    # ----------------------------------------------------------------- namespace
    def listdir(self, path: str) -> list[str]:
        self._fail_if_armed("eio_namespace")
        return super().listdir(path)

    def makedirs(self, path: str) -> None:
        self._fail_if_armed("eio_namespace")
        super().makedirs(path)

    def unlink(self, path: str) -> None:
        self._fail_if_armed("eio_namespace")
        super().unlink(path)

    def rename(self, source: str, target: str) -> None:
        self._fail_if_armed("eio_namespace")
        super().rename(source, target)

    def lock(self, fd: int) -> None:
        if self._draw(("lock_held",), errors=()) is not None:
            with self._lock:
                self.injected["lock_held"] += 1
            raise BlockingIOError(errno.EWOULDBLOCK, os.strerror(errno.EWOULDBLOCK))
        super().lock(fd)

    def io_uring_setup(self, entries: int, params_address: int) -> int:
        if self.io_uring_errno is not None:
            with self._lock:
                self.injected["io_uring_setup"] += 1
            raise OSError(self.io_uring_errno, os.strerror(self.io_uring_errno))
        return super().io_uring_setup(entries, params_address)

    # ----------------------------------------------------------------- helpers
    def _draw(self, kinds: tuple[str, ...], errors: tuple[tuple[float, str], ...]) -> str | None:
        """The fault of one call: an armed kind first, then the error rates, then shortness."""
        with self._lock:
            for kind in kinds:
                if self._armed[kind]:
                    self._armed[kind] -= 1
                    return kind
            for rate, kind in errors:
                if rate and self._rng.random() < rate:
                    return kind
            short = kinds[-1]  # read/write calls list their short kind last; fsync has none
            rate = self.short_transfer_rate if short.startswith("short") else 0.0
            if rate and self._rng.random() < rate:
                return short
        return None

    def _fail_if_armed(self, kind: str) -> None:
        """Raise the error of ``kind`` when a call of it is armed (no rate applies to it)."""
        self._raise_if(self._draw((kind,), errors=()))

    def _raise_if(self, kind: str | None) -> None:
        if kind is None:
            return
        with self._lock:
            self.injected[kind] += 1
        code = errno.ENOSPC if kind == "enospc" else errno.EIO
        raise OSError(code, os.strerror(code))

    def _apply(self, fault: str | None, fd: int, buffers: Sequence[Any]) -> Sequence[Any]:
        """Raise an injected error, or return the (possibly shortened) buffer list to use."""
        if fault is None:
            return buffers
        if not fault.startswith("short"):
            self._raise_if(fault)
        views = [memoryview(b).cast("B") for b in buffers]
        total = sum(v.nbytes for v in views)
        # On O_DIRECT a transfer must stay aligned, so cut whole pages only.
        unit = PAGE_SIZE_BYTES if fcntl.fcntl(fd, fcntl.F_GETFL) & Env.direct_flag() else 1
        most = (total - 1) // unit  # whole units strictly short of the full transfer
        if most < 1:
            return buffers  # too small to shorten: the call goes through whole
        with self._lock:
            cut = self._rng.randint(1, most) * unit
            self.injected[fault] += 1
        shortened: list[memoryview] = []
        for view in views:
            if cut <= 0:
                break
            shortened.append(view[:cut])
            cut -= view.nbytes
        return shortened
