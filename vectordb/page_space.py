"""PageSpace: the pages of ``postings.dat``, handed out as contiguous runs and reused.

The file grows by preallocated chunks (``IOEngine.preallocate``). Free runs come from one
ExtentAllocator counted in pages, over a huge arena of which nothing is free until the file
holds it (``all_free=False``): growing the file is one more ``free``.

Crash safety rests on one rule: a run freed since the last checkpoint is not reused until the
next checkpoint has committed (``release_pending``), because the last checkpoint may still point
at it. Pages written after a checkpoint are therefore never ones the checkpoint reads.

Concurrency: loop thread only; not thread-safe.
Invariants: every free run lies inside the preallocated file; a run is free, or owned by one
posting list, or pending (freed after the last checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterable

from tiers.io import FileHandle, IOEngine
from tiers.storage import ExtentAllocator
from vectordb.posting_format import PAGE_BYTES

__all__ = ["PageSpace"]

_ARENA_PAGES = 1 << 40
_MIN_GROWTH_PAGES = 4096  # 16 MiB


class PageSpace:
    """Runs of pages in one file; ``file_pages`` of it are preallocated."""

    def __init__(self, engine: IOEngine, file: FileHandle, file_pages: int) -> None:
        self.engine = engine
        self.file = file
        self.file_pages = 0
        self._allocator = ExtentAllocator(_ARENA_PAGES, 1, all_free=False)
        self._pending: list[tuple[int, int]] = []
        self.pending_pages = 0  # in the pending runs
        self._grow_to(file_pages, free=False)

    def adopt(self, used: Iterable[tuple[int, int]]) -> None:
        """Free every page of the file not in ``used`` (start, pages) runs; call once, at open."""
        cursor = 0
        for start, pages in sorted(used):
            if start < cursor or start + pages > self.file_pages:
                raise ValueError(f"posting run {start}+{pages} overlaps or leaves the file")
            if start > cursor:
                self._allocator.free(cursor, start - cursor)
            cursor = start + pages
        if self.file_pages > cursor:
            self._allocator.free(cursor, self.file_pages - cursor)

    async def allocate(self, pages: int) -> int:
        """First page of a free run of ``pages`` pages; grows the file when no hole fits."""
        start = self._allocator.allocate(pages)
        if start is not None:
            return start
        growth = max(pages, _MIN_GROWTH_PAGES, self.file_pages // 4)
        old = self.file_pages
        await self.engine.preallocate(self.file, old * PAGE_BYTES, growth * PAGE_BYTES)
        self._grow_to(old + growth, free=True)
        start = self._allocator.allocate(pages)
        assert start is not None
        return start

    def free_later(self, start: int, pages: int) -> None:
        """Give a run back once the next checkpoint has committed."""
        if pages > 0:
            self._pending.append((start, pages))
            self.pending_pages += pages

    def release_pending(self, runs: list[tuple[int, int]]) -> None:
        for start, pages in runs:
            self._allocator.free(start, pages)

    def take_pending(self) -> list[tuple[int, int]]:
        """The runs freed so far, to release after a checkpoint commits (and reads drain)."""
        runs, self._pending = self._pending, []
        self.pending_pages = 0
        return runs

    def _grow_to(self, pages: int, free: bool) -> None:
        if free and pages > self.file_pages:
            self._allocator.free(self.file_pages, pages - self.file_pages)
        self.file_pages = max(self.file_pages, pages)

    def stats(self) -> dict[str, int]:
        return {
            "file_pages": self.file_pages,
            "free_pages": self._allocator.free_bytes,
            "pending_free_runs": len(self._pending),
            "pending_free_pages": self.pending_pages,
        }
