"""FaultyEngine: an IOEngine wrapper for tests that injects I/O faults and simulates power cuts.

It delegates every file and I/O call to a real ``inner`` engine and, on the way, injects:
  * EIO on a read or write (a typed StorageError with errno, path and offset), ENOSPC on a
    write (NoSpaceError), EIO on fsync: the failed request itself never happens;
  * short reads (the read returns fewer bytes, as if the file ended there; the caller's buffer
    past that point is left untouched).
Faults come from one-shot triggers (:meth:`FaultyEngine.fail_next`) first, then from rate knobs
drawn from a seeded RNG, so a seed replays the same faults. Zero-length requests are never hit.
Injected faults keep the batch contract: the rest of the batch still runs to completion before
the first failure is raised, with ``batch_results`` attached.

:meth:`FaultyEngine.power_cut` undoes, through a :class:`~tiers.testing.crash_log.CrashLog`, every
write not yet fsynced (or keeps a random subset of them), then leaves the engine dead: every
later call raises EngineClosedError (``aclose`` is a no-op), like a machine that lost power.

Concurrency: like every engine, loop-thread only; any number of batches may be in flight.
Invariants: a request the wrapper failed never reaches ``inner`` and has result 0; the crash
log holds every completed write made through this engine since its file's last fsync (old bytes
are read with plain ``os.pread`` on a separate buffered descriptor: see tiers.testing.crash_log).
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
from collections import Counter, deque
from typing import Any, Literal

import numpy as np

from tiers.io.batch import IOBatch, Op
from tiers.io.buffers import PAGE_SIZE_BYTES, BufferRef
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import EngineClosedError, InvalidArgumentError, error_from_errno
from tiers.testing.crash_log import CrashLog, PowerCutReport, UnsyncedWrite

__all__ = ["FAULT_KINDS", "FaultKind", "FaultyEngine", "PowerCutAt", "PowerCutReport"]

FaultKind = Literal["eio", "eio_read", "eio_write", "short_read", "enospc", "eio_fsync"]
FAULT_KINDS: tuple[str, ...] = ("eio", "eio_read", "eio_write", "short_read", "enospc", "eio_fsync")
# Trigger order per request type: the first armed kind in the list fires.
_READ_KINDS = ("eio_read", "eio", "short_read")
_WRITE_KINDS = ("enospc", "eio_write", "eio")


class FaultyEngine(IOEngine):
    """Wraps ``inner`` (which it owns and closes); injects faults; simulates power loss.

    Args:
        seed: seeds the RNG behind the rate knobs, random short-read lengths and
            ``power_cut(keep="random")``.
        eio_rate / short_read_rate / enospc_rate: per-request probabilities in [0, 1]
            (EIO hits reads and writes; short reads hit reads; ENOSPC hits writes). Mutable.
        track_writes: keep the crash log that :meth:`power_cut` needs (costs a copy of the old
            and new bytes of every unsynced write).
    """

    name = "faulty"

    def __init__(
        self,
        inner: IOEngine,
        *,
        seed: int = 0,
        eio_rate: float = 0.0,
        short_read_rate: float = 0.0,
        enospc_rate: float = 0.0,
        track_writes: bool = True,
    ) -> None:
        super().__init__(inner.queue_depth, inner.env)
        if not all(0.0 <= rate <= 1.0 for rate in (eio_rate, short_read_rate, enospc_rate)):
            raise InvalidArgumentError("fault rates must lie in [0, 1]")
        self.inner = inner
        self.name = f"faulty({inner.name})"
        self.supports_direct_io = inner.supports_direct_io
        self.eio_rate = eio_rate
        self.short_read_rate = short_read_rate
        self.enospc_rate = enospc_rate
        self.rng = random.Random(seed)
        self.injected: Counter[str] = Counter()  # faults injected so far, by kind
        self._armed: dict[str, deque[int | None]] = {kind: deque() for kind in FAULT_KINDS}
        self._log = CrashLog() if track_writes else None
        self._powered_off = False

    def fail_next(self, kind: FaultKind, count: int = 1, *, short_bytes: int | None = None) -> None:
        """Make the next ``count`` matching requests fail (or, for "short_read", come back short).

        Kinds: "eio_read", "eio_write", "eio" (the next read or write), "enospc" (writes),
        "short_read", "eio_fsync". A short read returns at most ``short_bytes`` bytes (default:
        half the request), rounded down to the alignment on an O_DIRECT file.
        """
        if kind not in FAULT_KINDS:
            raise InvalidArgumentError(f"unknown fault kind {kind!r}; choose from {FAULT_KINDS}")
        if count < 0 or (short_bytes is not None and short_bytes < 0):
            raise InvalidArgumentError("count and short_bytes must not be negative")
        if short_bytes is not None and kind != "short_read":
            raise InvalidArgumentError("short_bytes only applies to 'short_read'")
        self._armed[kind].extend([short_bytes] * count)

    # ----------------------------------------------------------------- files
    async def open(
        self,
        path: str | os.PathLike[str],
        *,
        write: bool = False,
        create: bool = False,
        truncate: bool = False,
        direct: bool = False,
        alignment_bytes: int = PAGE_SIZE_BYTES,
    ) -> FileHandle:
        self._check_open()
        flags = {"write": write, "create": create, "truncate": truncate, "direct": direct}
        file = await self.inner.open(path, alignment_bytes=alignment_bytes, **flags)
        if truncate and self._log is not None:
            self._log.forget(file.path)
        return file

    async def close_file(self, file: FileHandle) -> None:
        self._check_alive()
        await self.inner.close_file(file)

    def file_size(self, file: FileHandle) -> int:
        self._check_alive()
        return self.inner.file_size(file)

    # ----------------------------------------------------------------- I/O
    def _start(self, batch: IOBatch) -> None:  # pragma: no cover - run() never calls it
        raise AssertionError("FaultyEngine overrides run(); inner engines start batches")

    async def run(self, batch: IOBatch) -> None:
        self._check_open()
        if not len(batch):
            return
        self._inflight_batches += 1
        task = asyncio.ensure_future(self._execute(batch))
        task.add_done_callback(self._batch_done)
        # Shielded: cancelling the caller must not abandon the bookkeeping of I/O in flight.
        await asyncio.shield(task)
        if batch.errors:
            self._raise_first_error(batch)

    async def _execute(self, batch: IOBatch) -> None:
        lengths = batch.lengths.copy()
        for row in range(len(batch)):
            self._inject(batch, row, lengths)
        rows = np.array([r for r in range(len(batch)) if r not in batch.errors], np.int64)
        writes, syncs = self._log_begin(batch, rows, lengths)
        try:
            if len(rows):
                await self._run_inner(batch, rows, lengths)
        finally:
            if self._log is not None:
                for row, record in writes:
                    ok = row not in batch.errors and batch.results[row] == lengths[row]
                    self._log.end_write(batch.files[row].path, record, ok)
                for row, token in syncs:
                    if row not in batch.errors:
                        self._log.end_sync(batch.files[row].path, token)

    def _inject(self, batch: IOBatch, row: int, lengths: np.ndarray) -> None:
        """Decide the fault (if any) of one request: record an error or shorten it."""
        op = batch.ops[row]
        file: FileHandle = batch.files[row]
        length = int(lengths[row])
        if op >= Op.FSYNC:
            drawn = self._draw_armed(("eio_fsync",), 0)
        else:
            drawn = self._draw(op == Op.READ, length) if length else None
        if drawn is None:
            return
        kind, cut = drawn
        if kind == "short_read":
            assert cut is not None
            if file.direct:
                cut -= cut % file.alignment_bytes
            lengths[row] = cut
        else:
            code = errno.ENOSPC if kind == "enospc" else errno.EIO
            if kind == "eio":
                kind = "eio_read" if op == Op.READ else "eio_write"
            batch.errors[row] = error_from_errno(code, file.path, int(batch.offsets[row]))
        self.injected[kind] += 1

    def _draw(self, is_read: bool, length: int) -> tuple[str, int | None] | None:
        """Armed one-shot faults first, then the rate knobs. For a short read, also the
        number of bytes it keeps."""
        armed = self._draw_armed(_READ_KINDS if is_read else _WRITE_KINDS, length)
        if armed is not None:
            return armed
        if is_read:
            if self.eio_rate and self.rng.random() < self.eio_rate:
                return "eio", None
            if self.short_read_rate and self.rng.random() < self.short_read_rate:
                return "short_read", self.rng.randrange(length)
            return None
        if self.enospc_rate and self.rng.random() < self.enospc_rate:
            return "enospc", None
        if self.eio_rate and self.rng.random() < self.eio_rate:
            return "eio", None
        return None

    def _draw_armed(self, kinds: tuple[str, ...], length: int) -> tuple[str, int | None] | None:
        for kind in kinds:
            if self._armed[kind]:
                want = self._armed[kind].popleft()
                if kind != "short_read":
                    return kind, None
                return kind, length // 2 if want is None else min(want, length)
        return None

    def _log_begin(
        self, batch: IOBatch, rows: np.ndarray, lengths: np.ndarray
    ) -> tuple[list[tuple[int, UnsyncedWrite]], list[tuple[int, Any]]]:
        """Capture old/new bytes of the writes about to be issued and the scope of fsyncs."""
        if self._log is None:
            return [], []
        write_rows = [r for r in rows.tolist() if batch.ops[r] == Op.WRITE and lengths[r]]
        items = []
        for r in write_rows:
            view = BufferRef(int(batch.addresses[r]), int(lengths[r]), False, None).memoryview()
            items.append((batch.files[r].path, int(batch.offsets[r]), view.tobytes()))
        records = self._log.begin_writes(items)
        syncs = [
            (r, self._log.begin_sync(batch.files[r].path))
            for r in rows.tolist()
            if batch.ops[r] >= Op.FSYNC
        ]
        return list(zip(write_rows, records, strict=True)), syncs

    async def _run_inner(self, batch: IOBatch, rows: np.ndarray, lengths: np.ndarray) -> None:
        """Run the surviving requests as one sub-batch of ``inner``; map outcomes back."""
        sub = IOBatch(
            batch.ops[rows],
            [batch.files[r] for r in rows.tolist()],
            batch.addresses[rows],
            lengths[rows],
            batch.offsets[rows],
            batch.owners,
        )
        sub.base = batch.base  # every surviving row still lies in the caller's one buffer
        try:
            await self.inner.run(sub)
        except BaseException as exc:
            # A per-request failure is raised only after the whole sub-batch finished; anything
            # else (a closed file, say) means nothing ran and goes to the caller as is.
            if not sub.errors or exc is not sub.errors[min(sub.errors)]:
                raise
        batch.results[rows] = sub.results
        for index, error in sub.errors.items():
            if hasattr(error, "batch_results"):
                error.batch_results = None  # indexed by the sub-batch; reset below if raised
            batch.errors[int(rows[index])] = error

    def _batch_done(self, task: asyncio.Future[None]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here too, in case the caller was cancelled
        self._inflight_batches -= 1
        if not self._inflight_batches:
            for waiter in self._drained:
                if not waiter.done():
                    waiter.set_result(None)
            self._drained.clear()

    # ----------------------------------------------------------------- lifecycle
    def _check_alive(self) -> None:
        if self._powered_off:
            raise EngineClosedError(f"{self.name} engine lost power (power_cut)")

    def _check_open(self) -> None:
        self._check_alive()
        super()._check_open()

    async def _shutdown(self) -> None:
        # IOEngine.aclose has waited for this wrapper's batches; the inner engine owns the rest.
        await self.inner.aclose()

    async def power_cut(self, keep: Literal["none", "random"] = "none") -> PowerCutReport:
        """Simulate losing power: let accepted batches finish, close the inner engine, put every
        file written through this engine back to its last-fsynced image (``keep="random"``:
        plus a random subset of the unsynced writes, each whole), and leave this engine dead.

        Allowed after :meth:`aclose` too (closing a file does not make its writes durable).
        """
        self._check_alive()
        if keep not in ("none", "random"):
            raise InvalidArgumentError(f"keep must be 'none' or 'random', got {keep!r}")
        if self._log is None:
            raise InvalidArgumentError("power_cut needs track_writes=True")
        self._powered_off = True
        await super().aclose()  # drains, then closes inner (already done if aclose came first)
        return self._log.restore(self.rng, keep)

    def stats(self) -> dict[str, Any]:
        """The inner engine's counters plus ``injected_<kind>`` counts."""
        out = {**self.inner.stats(), "engine": self.name}
        out.update({f"injected_{kind}": n for kind, n in sorted(self.injected.items())})
        return out


class PowerCutAt(FaultyEngine):
    """Loses power right before its ``cut_at``-th batch (``keep`` as in ``power_cut``):
    crash tests run a workload once uncut to count ``batches``, then cut at chosen points."""

    def __init__(
        self, inner: IOEngine, cut_at: int, *, seed: int = 0,
        keep: Literal["none", "random"] = "random",
    ) -> None:  # fmt: skip
        super().__init__(inner, seed=seed)
        self.cut_at = cut_at
        self.keep: Literal["none", "random"] = keep
        self.batches = 0

    async def run(self, batch: IOBatch) -> None:
        self.batches += 1
        if self.batches == self.cut_at:
            await self.power_cut(self.keep)
        await super().run(batch)
