"""PageSpace: the pages of ``postings.dat``, handed out as contiguous runs and reused.

The file grows by preallocated chunks (``IOEngine.preallocate``) when no free run fits. Runs
come from one GrowableSpace (tiers.storage) counted in pages, whose growth callback is
``_grow``: page ``p`` is file offset ``p * PAGE_BYTES``.

Crash safety rests on one rule: a run freed since the last checkpoint is not reused until the
next checkpoint has committed, because the last checkpoint may still point at it: ``free_later``
defers the run to the space's current epoch, a committed checkpoint ends it
(``take_pending``) and releases it once searches of the old state are done
(``release_pending``). Pages written after a checkpoint are therefore never ones it reads.

Concurrency: loop thread only; not thread-safe.
Invariants: every free run lies inside the preallocated file; a run is free, or owned by one
posting list, or pending (freed after the last checkpoint, or in an epoch not yet released).
"""

from __future__ import annotations

from collections.abc import Iterable

from tiers.io import FileHandle, IOEngine
from tiers.storage import GrowableSpace
from vectordb.posting_format import PAGE_BYTES

__all__ = ["PageSpace"]

_ARENA_PAGES = 1 << 40
_MIN_GROWTH_PAGES = 4096  # 16 MiB


class PageSpace:
    """Runs of pages in one file; ``file_pages`` of it are preallocated."""

    def __init__(self, engine: IOEngine, file: FileHandle, file_pages: int) -> None:
        self.engine = engine
        self.file = file
        self.file_pages = file_pages  # adopted (freed but for the lists) by ``adopt``
        self._space = GrowableSpace(_ARENA_PAGES, 1, self._grow)

    @property
    def pending_pages(self) -> int:
        """Pages freed since the last checkpoint."""
        return self._space.pending

    def adopt(self, used: Iterable[tuple[int, int]]) -> None:
        """Free every page of the file not in ``used`` (start, pages) runs; call once, at open."""
        runs = [(start, pages, (start, pages)) for start, pages in sorted(used)]
        bad = self._space.adopt(0, self.file_pages, runs)
        if bad:
            start, pages = bad[0]
            raise ValueError(f"posting run {start}+{pages} overlaps or leaves the file")

    async def allocate(self, pages: int) -> int:
        """First page of a free run of ``pages`` pages; grows the file when no hole fits."""
        return await self._space.allocate(pages)

    def free_later(self, start: int, pages: int) -> None:
        """Give a run back once the next checkpoint has committed."""
        self._space.free(start, pages, deferred=True)

    def take_pending(self) -> int:
        """After a checkpoint commits: the runs freed so far (as the space's epoch that holds
        them), to release once searches that may still read them are done."""
        return self._space.advance_epoch()

    def release_pending(self, epoch: int) -> None:
        self._space.release_pending(epoch)

    def pending_runs(self) -> list[tuple[int, int]]:
        """Every run freed but not yet reusable (start, pages)."""
        return self._space.pending_runs()

    async def _grow(self, pages: int) -> list[tuple[int, int]]:
        growth = max(pages, _MIN_GROWTH_PAGES, self.file_pages // 4)
        old = self.file_pages
        await self.engine.preallocate(self.file, old * PAGE_BYTES, growth * PAGE_BYTES)
        self.file_pages = old + growth
        return [(old, growth)]

    def stats(self) -> dict[str, int]:
        space = self._space.stats()
        return {
            "file_pages": self.file_pages,
            "free_pages": space["free"],
            "pending_free_runs": space["pending_runs"],
            "pending_free_pages": space["pending"],
        }
