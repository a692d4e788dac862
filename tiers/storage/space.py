"""GrowableSpace: runs of an address space whose backing grows on demand, with deferred frees.

The one allocator of durable space: the NVMe tier's extent files (tiers.nvme.space, in bytes)
and the vector index's posting file (vectordb.page_space, in pages) both hand out runs of it.
Free runs come from one ExtentAllocator over a huge arena of which nothing is free until its
backing exists. The backing grows only through the space: when no free run fits, ``allocate``
awaits the owner's ``grow(size)`` callback, which makes room durable (fallocate, fsync) and
returns the ranges it added; they are freed and merge with a free tail before them, which
``free_before`` measures so the callback takes no more than it needs.

A freed run is not always free at once. Two rules defer it, and may both apply:

* *pins*: a read pins the start of the run it reads; a run freed while pinned is freed at the
  last ``unpin``, so it is never rewritten under a read in flight;
* *epochs*: ``free(..., deferred=True)`` holds a run until the current epoch ends and that
  epoch is released: a checkpoint calls ``advance_epoch`` once it has committed and
  ``release_pending(epoch)`` once no reader of the old state is left, so pages written after a
  checkpoint are never ones it (or a search of it) still reads.

Concurrency: loop thread only; not thread-safe. Growth is serialised by one asyncio lock and
re-tries the allocation first, as another caller may have grown the space meanwhile.
Invariants: every free unit lies inside backing that was added; a unit is free, owned by one
caller, pending in exactly one epoch, or waiting for its last unpin -- never two of these.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from tiers.io.errors import InvalidArgumentError
from tiers.storage.extents import ExtentAllocator

__all__ = ["Grow", "GrowableSpace"]

T = TypeVar("T")
# grow(size) -> the (start, size) ranges of new backing, durable, that hold a run of ``size``
Grow = Callable[[int], Awaitable[Iterable[tuple[int, int]]]]


class GrowableSpace:
    """Runs of ``alignment``-aligned units from ``[0, arena)``, grown by ``grow``."""

    def __init__(self, arena: int, alignment: int, grow: Grow) -> None:
        self._allocator = ExtentAllocator(arena, alignment, all_free=False)
        self._grow = grow
        self._grow_lock = asyncio.Lock()
        self.backed = 0  # units of backing added (adopted or grown)
        self._pins: dict[int, int] = {}  # start -> reads in flight
        self._at_unpin: dict[int, int] = {}  # start -> size, freed at the last unpin
        self._epoch = 0  # the current epoch: deferred frees join it
        self._pending: list[tuple[int, int]] = []  # runs freed (deferred) in the current epoch
        self.pending = 0  # units in ``_pending``
        self._sealed: dict[int, list[tuple[int, int]]] = {}  # ended epoch -> runs not released

    # ----------------------------------------------------------------- backing
    def adopt(self, start: int, size: int, used: Iterable[tuple[int, int, T]]) -> list[T]:
        """Add ``[start, start + size)`` as existing backing, free except the ``used`` runs
        (start, size, tag). Returns the tags of runs that cannot be right (misaligned,
        overlapping an earlier one, or leaving the range): their space is left alone."""
        bad: list[T] = []
        cursor, end = start, start + size
        alignment = self._allocator.alignment_bytes
        for run_start, run_size, tag in sorted(used, key=lambda run: run[0]):
            if run_start % alignment or run_start < cursor or run_start + run_size > end:
                bad.append(tag)
            else:
                self._add(cursor, run_start - cursor)
                cursor = run_start + run_size
        self._add(cursor, end - cursor)
        self.backed += size
        return bad

    def free_before(self, address: int) -> int:
        """Size of the free run that ends exactly at ``address`` (0 when none does)."""
        return self._allocator.free_bytes_before(address)

    async def allocate(self, size: int) -> int:
        """Start of a free run of ``size`` units; grows the backing when no hole fits.

        Raises what ``grow`` raises (NoSpaceError, StorageError); nothing is taken then.
        """
        start = self._allocator.allocate(size)
        if start is not None:
            return start
        async with self._grow_lock:
            start = self._allocator.allocate(size)  # someone may have grown meanwhile
            if start is None:
                for new_start, new_size in await self._grow(self._allocator.rounded(size)):
                    self._add(new_start, new_size)
                    self.backed += new_size
                start = self._allocator.allocate(size)
                if start is None:
                    raise InvalidArgumentError(f"growth left no free run of {size}")
            return start

    def try_allocate(self, size: int) -> int | None:
        """Start of a free run of ``size`` units from the holes there are, or None (nothing
        grows): a batch asks for one run for all its records before asking record by record."""
        return self._allocator.allocate(size)

    # ----------------------------------------------------------------- frees
    def free_many(self, runs: list[tuple[int, int]]) -> None:
        """``free`` each (start, size) run now; runs that touch are merged first (one allocator
        call for a batch's records laid end to end) unless a pin could name one of them."""
        if self._pins:
            for start, size in runs:
                self.free(start, size)
            return
        merged_start, merged_end = -1, -1
        for start, size in sorted(runs):
            if start != merged_end:
                if merged_end > merged_start:
                    self._allocator.free(merged_start, merged_end - merged_start)
                merged_start = start
            merged_end = start + self._allocator.rounded(size)
        if merged_end > merged_start:
            self._allocator.free(merged_start, merged_end - merged_start)

    def free(self, start: int, size: int, *, deferred: bool = False) -> None:
        """Give a run back: now, at its last unpin, or (``deferred``) once this epoch is
        released."""
        if deferred:
            if size > 0:
                self._pending.append((start, size))
                self.pending += size
        elif start in self._pins:
            if start in self._at_unpin:
                raise InvalidArgumentError(f"double free of run {start}+{size}")
            self._at_unpin[start] = size
        else:
            self._allocator.free(start, size)

    def pin(self, start: int) -> None:
        self._pins[start] = self._pins.get(start, 0) + 1

    def unpin(self, start: int) -> None:
        left = self._pins[start] - 1
        if left:
            self._pins[start] = left
            return
        del self._pins[start]
        size = self._at_unpin.pop(start, None)
        if size is not None:
            self._allocator.free(start, size)

    def advance_epoch(self) -> int:
        """End the current epoch; returns it, for ``release_pending`` once nothing may read the
        runs freed in it. Deferred frees from now on join the next epoch."""
        ended, self._epoch = self._epoch, self._epoch + 1
        if self._pending:
            self._sealed[ended] = self._pending
        self._pending, self.pending = [], 0
        return ended

    def release_pending(self, epoch: int) -> None:
        """Free the runs deferred in ``epoch`` (an ended one; pins still defer each)."""
        if epoch >= self._epoch:
            raise InvalidArgumentError(f"epoch {epoch} has not ended (now {self._epoch})")
        for start, size in self._sealed.pop(epoch, []):
            self.free(start, size)

    def pending_runs(self) -> list[tuple[int, int]]:
        """Every run whose free waits for an epoch's release (start, size)."""
        sealed = [run for runs in self._sealed.values() for run in runs]
        return sealed + self._pending

    def stats(self) -> dict[str, int]:
        return {
            "backed": self.backed,
            "free": self._allocator.free_bytes,
            "pinned": len(self._pins),
            "frees_at_unpin": len(self._at_unpin),
            "pending_runs": len(self._pending),
            "pending": self.pending,
            "sealed_runs": sum(len(runs) for runs in self._sealed.values()),
        }

    def _add(self, start: int, size: int) -> None:
        if size > 0:
            self._allocator.free(start, size)
