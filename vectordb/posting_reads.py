"""PostingRead: many posting lists read in one submission, handed over group by group.

A search needs a few thousand lists at once. All of them are submitted together (every group's
``read_batch`` starts in the same loop iteration, and the engine gathers requests started in
one iteration into one ``io_uring_enter``), so the device sees the whole batch; the groups are
only the unit of delivery: the caller scores one group while the others are still in flight.

Lists that lie back to back in the file (build lays them out in head order, and a batch's
lists are near each other: clustering.py) are read by one request: the device serves a few large
reads faster than many small ones. With ``bridge_pages``, a read also runs through a small gap
between two lists (the gap's bytes land in the buffer and are never looked at): on the device
measured here (benchmarks/RESULTS.md) a request costs about as much as 64 KiB of transfer.

Each list lands page-aligned in one shared buffer; a group's records are verified
(``verify_many``) before it is handed over, so a caller never sees an unchecked record.

Preconditions: built on the loop thread, synchronously from the directory it is given (so the
record counts and runs are one snapshot, whatever an updater does while the reads are in
flight). Thread-safety: loop thread only. Closing (or leaving ``groups()`` early) cancels the
waiting, never the I/O: the engine keeps the buffer alive until its requests finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Iterator
from typing import Any

import numpy as np

from tiers.io import FileHandle, IOEngine, aligned_empty
from vectordb.dot_kernel import VectorSpan
from vectordb.list_cache import ListCache
from vectordb.posting_format import PAGE_BYTES, pages_for, verify_many
from vectordb.widen import widen_float16

__all__ = [
    "BRIDGE_BYTES",
    "MAX_REQUEST_BYTES",
    "WIDEN_PIECE_BYTES",
    "PostingRead",
    "bridged_layout",
    "coalesce",
]

MAX_REQUEST_BYTES = 4 << 20  # a merged read stops growing here (the device splits it anyway)
BRIDGE_BYTES = 64 << 10  # a search's read runs through gaps up to this long (see above)
WIDEN_PIECE_BYTES = 2 << 20  # float16 records widened at a time (stays in cache for scoring)


def bridged_layout(
    file_pages: np.ndarray, pages: np.ndarray, bridge_pages: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Where lists read in this order land: (pages of gap read just before each list, each
    list's first page in the buffer, total pages). A gap is read when two non-empty lists,
    consecutive here, are at most ``bridge_pages`` apart in the file (``file_pages``: their
    first pages)."""
    n = len(pages)
    gap = np.zeros(n, np.int64)
    if n > 1 and bridge_pages > 0:
        between = file_pages[1:] - (file_pages[:-1] + pages[:-1])
        bridged = (between > 0) & (between <= bridge_pages) & (pages[1:] > 0) & (pages[:-1] > 0)
        gap[1:] = np.where(bridged, between, 0)
    ends = np.cumsum(gap + pages)
    return gap, ends - pages, int(ends[-1]) if n else 0


def coalesce(
    file_offsets: np.ndarray, lengths: np.ndarray, buffer_offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge each request with the previous one when both its file and its buffer range start
    where the previous one's end (up to ``MAX_REQUEST_BYTES`` per merged request)."""
    n = len(file_offsets)
    if n <= 1:
        return file_offsets, lengths, buffer_offsets
    follows = (file_offsets[1:] == file_offsets[:-1] + lengths[:-1]) & (
        buffer_offsets[1:] == buffer_offsets[:-1] + lengths[:-1]
    )
    run_id = np.concatenate([[0], np.cumsum(~follows)])
    # cut runs that would grow past the cap: bytes from the run's start, in whole caps
    run_first = np.flatnonzero(np.concatenate([[True], ~follows]))
    into_run = buffer_offsets - buffer_offsets[run_first][run_id]
    piece = run_id * (1 << 32) + (into_run + lengths - 1) // MAX_REQUEST_BYTES
    starts = np.flatnonzero(np.concatenate([[True], piece[1:] != piece[:-1]]))
    ends = np.concatenate([starts[1:], [n]]) - 1
    merged = buffer_offsets[ends] + lengths[ends] - buffer_offsets[starts]
    return file_offsets[starts], merged, buffer_offsets[starts]


class PostingRead:
    """The lists ``pids`` (snapshot of ``start``/``count``), split into ``n_groups`` groups of
    consecutive lists with about equal pages, read into ``allocate(bytes)`` (page-aligned, at
    least that long)."""

    def __init__(
        self,
        engine: IOEngine,
        file: FileHandle,
        dtype: np.dtype[Any],
        pids: np.ndarray,
        start: np.ndarray,
        count: np.ndarray,
        n_groups: int = 1,
        allocate: Callable[[int], np.ndarray] = aligned_empty,
        bridge_pages: int = 0,
        cache: ListCache | None = None,
    ) -> None:
        self.pids = np.asarray(pids, np.int64)
        self.dtype = dtype
        self.counts = count[self.pids].astype(np.int64)
        pages = pages_for(self.counts, dtype.itemsize)
        file_pages = start[self.pids]
        self.file_pages = file_pages  # the snapshot: where each list was read from
        gap, first_page, self.pages_read = bridged_layout(file_pages, pages, bridge_pages)
        self.byte_offsets = first_page * PAGE_BYTES
        # a spare page at the end: verify_many reads one word past the last record
        self.buffer = allocate((self.pages_read + 1) * PAGE_BYTES)
        self.edges = np.array([0, len(self.pids)], np.int64)
        if n_groups > 1:
            targets = np.linspace(0, self.pages_read, n_groups + 1)[1:-1]
            cuts = np.searchsorted(first_page + pages, targets, side="left") + 1
            self.edges = np.unique(np.concatenate([[0], cuts, [len(self.pids)]]))
        # each list's request starts with the gap before it, so it follows the previous one
        file_offsets = (file_pages - gap) * PAGE_BYTES
        lengths = (gap + pages) * PAGE_BYTES
        buffer_offsets = (first_page - gap) * PAGE_BYTES
        self._tasks: list[asyncio.Future[Any]] = []
        self.page_counts = pages
        # lists with a copy in the cache are copied, not read (the copy is checked like a read)
        self.cached = np.zeros(len(self.pids), bool)
        if cache is not None and len(self.pids):
            self.cached = cache.lookup(self.pids, file_pages, self.counts) & (pages > 0)
        from_disk = (pages > 0) & ~self.cached
        after_cached = np.concatenate([[False], self.cached[:-1]])
        if after_cached.any():  # the gap before a list is read only to join the one before
            skip = np.where(after_cached, gap, 0) * PAGE_BYTES
            file_offsets, lengths, buffer_offsets = (
                file_offsets + skip, lengths - skip, buffer_offsets + skip
            )  # fmt: skip
        self.disk_pages = 0  # pages read from the device (gaps included, cached lists not)
        self.lists_read = int(from_disk.sum())
        self.requests = 0  # I/O requests submitted (lists back to back in the file share one)
        copying = None
        if cache is not None and self.cached.any():
            copying = asyncio.ensure_future(self._copy_cached(cache, engine, file, file_pages))
        for first, stop in zip(self.edges[:-1].tolist(), self.edges[1:].tolist(), strict=True):
            has = from_disk[first:stop]
            waits = copying is not None and self.cached[first:stop].any()
            if not has.any() and not waits:
                continue
            read: Any = None
            if has.any():
                requests = coalesce(
                    file_offsets[first:stop][has],
                    lengths[first:stop][has],
                    buffer_offsets[first:stop][has],
                )
                self.requests += len(requests[0])
                self.disk_pages += int(requests[1].sum()) // PAGE_BYTES
                read = engine.read_batch(file, self.buffer, *requests)
            task = asyncio.ensure_future(_landed(read, copying if waits else None))
            task.group = (first, stop)  # type: ignore[attr-defined]
            self._tasks.append(task)
        if copying is not None:
            self._tasks.append(copying)  # finish() waits for it too; groups() never yields it
            copying.group = None  # type: ignore[attr-defined]

    def page_views(self, lists: np.ndarray) -> list[np.ndarray]:
        """The whole pages of each of ``lists`` (indexes into this read) in the buffer."""
        offsets = self.byte_offsets[lists].tolist()
        sizes = (self.page_counts[lists] * PAGE_BYTES).tolist()
        return [self.buffer[o : o + n] for o, n in zip(offsets, sizes, strict=True)]

    async def _copy_cached(
        self, cache: ListCache, engine: IOEngine, file: FileHandle, file_pages: np.ndarray
    ) -> None:
        """Copy the cached lists into place; read those evicted since their lookup."""
        lists = np.flatnonzero(self.cached)
        copied = await cache.copy_into(self.pids[lists], self.page_views(lists))
        missed = lists[~copied]
        if len(missed):
            self.cached[missed] = False
            await engine.read_batch(
                file,
                self.buffer,
                file_pages[missed] * PAGE_BYTES,
                self.page_counts[missed] * PAGE_BYTES,
                self.byte_offsets[missed],
            )

    def views(self, first: int, stop: int) -> list[np.ndarray]:
        """Records of lists ``first`` .. ``stop - 1`` (after their group landed), one view per
        list into the buffer."""
        size = self.dtype.itemsize
        offsets = self.byte_offsets[first:stop].tolist()
        counts = self.counts[first:stop].tolist()
        return [
            self.buffer[offset : offset + n * size].view(self.dtype)
            for offset, n in zip(offsets, counts, strict=True)
        ]

    def spans(self, first: int, stop: int) -> Iterator[tuple[int, VectorSpan]]:
        """``(offset, span)``: the records of lists ``first + offset`` ... as dot_kernel takes
        them, checked there. float32 and uint8 records: one span over the buffer itself.
        float16 ones: a span per piece of about ``WIDEN_PIECE_BYTES``, widened into this
        thread's scratch (valid until the next piece: use each before asking for the next)."""
        vector_type, vector_at = self.dtype.fields["vector"][:2]  # type: ignore[index]
        element, dim = vector_type.base, vector_type.shape[0]
        size = self.dtype.itemsize
        counts = self.counts[first:stop]
        offsets = self.byte_offsets[first:stop]
        words = self.buffer.view(np.uint64)

        def span(values: np.ndarray, at: np.ndarray, unit: int, a: int, b: int) -> VectorSpan:
            return VectorSpan(
                values, at, counts[a:b], size // unit, dim,
                words, offsets[a:b] // 8, size // 8, self.pids[first + a : first + b],
            )  # fmt: skip

        if element != np.float16:
            unit = element.itemsize
            values = self.buffer.view(element)
            yield 0, span(values, (offsets + vector_at) // unit, unit, 0, len(counts))
            return
        if stop <= first:
            return
        piece_of = (offsets - offsets[0]) // WIDEN_PIECE_BYTES
        cuts = np.flatnonzero(np.diff(piece_of)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(counts)], strict=True):
            low = int(offsets[a])
            high = int(offsets[b - 1]) + int(counts[b - 1]) * size
            wide = widen_float16(self.buffer[low:high].view(np.float16))
            yield a, span(wide, (offsets[a:b] - low + vector_at) // 2, 2, a, b)

    def verify(self, first: int, stop: int) -> None:
        """Check every record of lists ``first`` .. ``stop - 1`` (pure: any thread)."""
        verify_many(
            self.buffer,
            self.byte_offsets[first:stop],
            self.counts[first:stop],
            self.dtype,
            self.pids[first:stop],
        )

    async def finish(self) -> None:
        """Wait for every read of this batch (errors retrieved, not raised): call before the
        buffer is reused when :meth:`groups` was not run to its end."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def groups(self, verified: bool = True) -> AsyncGenerator[tuple[int, int], None]:
        """Yield ``(first, stop)`` list ranges as their reads complete (any order; a range
        whose lists are all empty comes first), verified unless ``verified=False`` (then the
        caller must :meth:`verify` a range before it trusts a record). Raises the first I/O
        error; the other reads are still awaited (their buffer is ours)."""
        groups = [t for t in self._tasks if t.group is not None]  # type: ignore[attr-defined]
        submitted = {task.group for task in groups}  # type: ignore[attr-defined]
        for first, stop in zip(self.edges[:-1].tolist(), self.edges[1:].tolist(), strict=True):
            if (first, stop) not in submitted:
                yield first, stop  # nothing to read
        pending = set(groups)
        try:
            while pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    task.result()
                    first, stop = task.group  # type: ignore[attr-defined]
                    if verified:
                        self.verify(first, stop)
                    yield first, stop
        finally:
            if pending:
                await asyncio.wait(pending)  # finish (and retrieve) what was started
                for task in pending:
                    if not task.cancelled():
                        task.exception()


async def _landed(read: Any, copying: asyncio.Future[None] | None) -> None:
    """A group has landed when its read and the copy of its cached lists are done."""
    if read is not None:
        await read
    if copying is not None:
        await asyncio.shield(copying)  # shared by every group: one group's cancel is not all's
