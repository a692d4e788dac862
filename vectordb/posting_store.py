"""PostingStore: posting lists on disk, each one contiguous run of pages, read many at once.

The directory (per posting id: first page, capacity in pages, record count) lives in memory as
numpy arrays and goes to LMDB with every checkpoint. Layout of the records: posting_format.

- ``begin_read(pids)`` reads every listed posting in ONE I/O-core submission (one request per
  list, page-rounded, O_DIRECT when enabled) and hands the lists over, verified, group by group
  (posting_reads); ``read(pids)`` returns them as one array.
- ``write(items)`` gives each list a new run (copy-on-write: the old run is freed only after the
  next checkpoint), all runs written in one submission.
- ``append(items)`` adds records in place when the run has room, rewriting only the page(s) the
  new records touch (the tail page is read first, in one submission for all lists); lists
  without room are moved to a larger run.

Invariant kept by the callers: a list never holds two valid copies of one vector (search keeps
only the best k records per list and query).

Concurrency: loop thread only. Readers may run while a writer awaits: a read snapshots the
directory rows it needs before its I/O, runs it reads are never reused before a checkpoint, and
an in-place append rewrites a tail page with the same bytes before the old count.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiers.io import FileHandle, IOEngine, aligned_empty
from vectordb.list_cache import ListCache
from vectordb.page_space import PageSpace
from vectordb.posting_format import PAGE_BYTES, encode, pages_for, record_dtype
from vectordb.posting_reads import PostingRead, bridged_layout

__all__ = ["SPARE_COUNT", "SPARE_LIMIT_BYTES", "PostingBatch", "PostingItem", "PostingStore"]

SPARE_LIMIT_BYTES = 320 << 20  # the largest search read buffer kept for reuse
SPARE_COUNT = 2  # read buffers kept: a search overlaps two chunks' reads (search.py)


@dataclass
class PostingItem:
    """Records for one posting list: ``ids`` int64, ``versions`` uint32, ``vectors`` [n, dim]."""

    pid: int
    ids: np.ndarray
    versions: np.ndarray
    vectors: np.ndarray
    capacity: int = 0  # records the run should hold (write); 0: just enough


@dataclass
class PostingBatch:
    """Records of several lists: list i is ``records[starts[i]:starts[i + 1]]``."""

    pids: np.ndarray
    records: np.ndarray
    starts: np.ndarray


class PostingStore:
    def __init__(self, engine: IOEngine, file: FileHandle, dim: int, dtype: Any, pages: int):
        self.engine = engine
        self.file = file
        self.dtype = record_dtype(dim, dtype)
        self.rec_bytes = self.dtype.itemsize
        self.space = PageSpace(engine, file, pages)
        self.start = np.zeros(0, np.int64)
        self.capacity = np.zeros(0, np.int32)  # records the run can hold; 0: no list
        self.count = np.zeros(0, np.int32)
        self.counters = {
            "posting_reads": 0,  # lists read
            "read_requests": 0,  # I/O requests they took (adjacent lists share one)
            "pages_read": 0,
            "bytes_read": 0,
            "pages_written": 0,
        }
        self._spares: list[np.ndarray] = []  # searches' read buffers, kept for the next ones
        self.spare_limit_bytes = SPARE_LIMIT_BYTES  # the memory budget may lower it (index)
        self.spare_count = SPARE_COUNT  # and keep one only, when it is tight
        self.cache: ListCache | None = None  # hot lists in DRAM (index: memory budget)

    # ----------------------------------------------------------------- directory
    def restore(self, start: np.ndarray, capacity: np.ndarray, count: np.ndarray) -> None:
        self.start, self.capacity, self.count = start.copy(), capacity.copy(), count.copy()
        live = np.flatnonzero(capacity > 0)
        runs = zip(start[live].tolist(), self._pages(capacity[live]).tolist(), strict=True)
        self.space.adopt(runs)

    def snapshot(self) -> dict[str, np.ndarray]:
        return {"start": self.start.copy(), "capacity": self.capacity, "count": self.count}

    def _ensure(self, pid: int) -> None:
        if pid >= len(self.start):
            size = max(pid + 1, 2 * len(self.start), 64)
            for name in ("start", "capacity", "count"):
                old = getattr(self, name)
                new = np.zeros(size, old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)

    def pages_of(self, pids: np.ndarray) -> np.ndarray:
        """Pages a read of each list takes now."""
        return self._pages(self.count[pids])

    def _pages(self, records: np.ndarray | int) -> np.ndarray:
        return pages_for(np.asarray(records, np.int64), self.rec_bytes)

    def drop(self, pid: int) -> None:
        """Forget a list; its run is reused after the next checkpoint."""
        self._changed(pid)
        if pid < len(self.capacity) and self.capacity[pid]:
            self.space.free_later(int(self.start[pid]), int(self._pages(self.capacity[pid])))
            self.capacity[pid] = self.count[pid] = 0

    def _changed(self, pids: Any) -> None:
        if self.cache is not None:  # before the new bytes can be read: no stale copy is used
            self.cache.note_changed(pids)

    # ----------------------------------------------------------------- reads
    def read_pages(self, pids: np.ndarray, bridge_pages: int = 0) -> int:
        """Pages a read of the lists ``pids``, in this order, takes now (gaps included)."""
        pids = np.asarray(pids, np.int64)
        return bridged_layout(self.start[pids], self.pages_of(pids), bridge_pages)[2]

    def begin_read(
        self,
        pids: np.ndarray,
        n_groups: int = 1,
        allocate: Callable[[int], np.ndarray] = aligned_empty,
        bridge_pages: int = 0,
    ) -> PostingRead:
        """Start reading the lists ``pids`` (one submission); see PostingRead. ``allocate``
        gives the buffer: a fresh one by default, :meth:`take_buffer` for the reusable spare
        (the caller then hands it back with :meth:`recycle` once nothing refers to it), or a
        part of a larger buffer (batch_reads). ``bridge_pages``: read through gaps up to this
        long between lists consecutive in ``pids`` (posting_reads)."""
        read = PostingRead(
            self.engine,
            self.file,
            self.dtype,
            pids,
            self.start,
            self.count,
            n_groups,
            allocate,
            bridge_pages,
            self.cache,
        )
        c = self.counters
        c["posting_reads"] += read.lists_read
        c["read_requests"] += read.requests
        c["pages_read"] += read.disk_pages
        c["bytes_read"] += read.disk_pages * PAGE_BYTES
        return read

    def take_buffer(self, size_bytes: int) -> np.ndarray:
        """A page-aligned read buffer of at least ``size_bytes``: the smallest spare big
        enough, else a new one (hand it back with :meth:`recycle`)."""
        fitting = [b for b in self._spares if len(b) >= size_bytes]
        if fitting:
            spare = min(fitting, key=len)
            self._spares = [b for b in self._spares if b is not spare]
            return spare
        # spares too small stay: the new buffer may be too big to keep (recycle); but where one
        # buffer is all a tight memory budget keeps, it is freed before a larger one is made
        if self.spare_count <= 1:
            self._spares = []
        # new memory is slow to touch the first time (page faults; in a VM, the host backing
        # it): round up, so a slightly larger next batch still fits, but not past what is kept
        rounded = -(-size_bytes * 5 // 4 // PAGE_BYTES) * PAGE_BYTES
        if size_bytes <= self.spare_limit_bytes:
            rounded = min(rounded, self.spare_limit_bytes)
        else:  # never kept (recycle): room for a next batch would be memory for nothing
            rounded = -(-size_bytes // PAGE_BYTES) * PAGE_BYTES
        return aligned_empty(rounded)

    def recycle(self, buffer: np.ndarray) -> None:
        """Keep a pooled read's buffer for a later one: at most ``SPARE_COUNT`` spares of at
        most ``spare_limit_bytes`` each, the larger ones kept."""
        if len(buffer) > self.spare_limit_bytes:
            return
        self._spares.append(buffer)
        if len(self._spares) > self.spare_count:
            smallest = min(self._spares, key=len)
            self._spares = [b for b in self._spares if b is not smallest]

    async def read(self, pids: np.ndarray) -> PostingBatch:
        """The lists' records, verified, copied into one array (for rewrites, not searches)."""
        pids = np.asarray(pids, np.int64)
        read = self.begin_read(pids)
        async with aclosing(read.groups()) as groups:
            async for _ in groups:
                pass
        views = read.views(0, len(pids))
        starts = np.zeros(len(pids) + 1, np.int64)
        np.cumsum([len(v) for v in views], out=starts[1:])
        records = np.concatenate(views) if views else np.zeros(0, self.dtype)
        return PostingBatch(pids, records, starts)

    # ----------------------------------------------------------------- writes
    async def write(self, items: list[PostingItem]) -> None:
        """Replace each item's list with exactly its records, in a new run."""
        if not items:
            return
        runs: list[tuple[int, int]] = []
        for item in items:
            pages = int(self._pages(max(item.capacity, len(item.ids), 1)))
            capacity = pages * PAGE_BYTES // self.rec_bytes  # the last page's room is free
            runs.append((await self.space.allocate(pages), capacity))
        used_pages = [int(self._pages(len(item.ids))) for item in items]
        buffer = aligned_empty(sum(used_pages) * PAGE_BYTES)
        offset = 0
        file_offsets, buffer_offsets, lengths = [], [], []
        for item, pages in zip(items, used_pages, strict=True):
            n = len(item.ids)
            out = buffer[offset : offset + n * self.rec_bytes].view(self.dtype)
            encode(out, item.pid, item.ids, item.versions, item.vectors)
            buffer[offset + n * self.rec_bytes : offset + pages * PAGE_BYTES] = 0
            if pages:
                buffer_offsets.append(offset)
                lengths.append(pages * PAGE_BYTES)
            offset += pages * PAGE_BYTES
        for (start, _), pages in zip(runs, used_pages, strict=True):
            if pages:
                file_offsets.append(start * PAGE_BYTES)
        if file_offsets:
            await self.engine.write_batch(
                self.file,
                buffer,
                np.asarray(file_offsets, np.int64),
                np.asarray(lengths, np.int64),
                np.asarray(buffer_offsets, np.int64),
            )
        self.counters["pages_written"] += sum(used_pages)
        for item, (start, capacity) in zip(items, runs, strict=True):
            self.drop(item.pid)
            self._ensure(item.pid)
            self.start[item.pid] = start
            self.capacity[item.pid] = capacity
            self.count[item.pid] = len(item.ids)

    async def append(self, items: list[PostingItem], headroom: float = 0.5) -> None:
        """Add records to lists (in place where the run has room); a list with no run yet (an
        index that was never built: its first inserts choose the heads) gets one."""
        for item in items:
            self._ensure(item.pid)
        in_place = [i for i in items if self.count[i.pid] + len(i.ids) <= self.capacity[i.pid]]
        moved = [i for i in items if self.count[i.pid] + len(i.ids) > self.capacity[i.pid]]
        if moved:
            old = await self.read(np.array([i.pid for i in moved], np.int64))
            grown = []
            for k, item in enumerate(moved):
                rec = old.records[old.starts[k] : old.starts[k + 1]]
                n = len(rec) + len(item.ids)
                grown.append(
                    PostingItem(
                        item.pid,
                        np.concatenate([rec["id"], item.ids]),
                        np.concatenate([rec["version"], item.versions]),
                        np.concatenate([rec["vector"], item.vectors]),
                        capacity=int(n + max(8, n * headroom)),
                    )
                )
            await self.write(grown)
        if in_place:
            await self._append_in_place(in_place)

    async def _append_in_place(self, items: list[PostingItem]) -> None:
        pids = np.array([i.pid for i in items], np.int64)
        self._changed(pids)
        old_bytes = self.count[pids].astype(np.int64) * self.rec_bytes
        new_bytes = old_bytes + np.array([len(i.ids) for i in items]) * self.rec_bytes
        first_page = old_bytes // PAGE_BYTES
        last_page = -(-new_bytes // PAGE_BYTES)
        span_pages = last_page - first_page
        buffer_pages = np.zeros(len(items) + 1, np.int64)
        np.cumsum(span_pages, out=buffer_pages[1:])
        buffer = aligned_empty(int(buffer_pages[-1]) * PAGE_BYTES)
        file_offsets = (self.start[pids] + first_page) * PAGE_BYTES
        buffer_offsets = buffer_pages[:-1] * PAGE_BYTES
        has_tail = old_bytes % PAGE_BYTES > 0  # a partly used page: keep its bytes
        if has_tail.any():
            await self.engine.read_batch(
                self.file, buffer, file_offsets[has_tail], PAGE_BYTES, buffer_offsets[has_tail]
            )
        for k, item in enumerate(items):
            at = int(buffer_offsets[k] + old_bytes[k] % PAGE_BYTES)
            n = len(item.ids)
            encode(
                buffer[at : at + n * self.rec_bytes].view(self.dtype),
                item.pid,
                item.ids,
                item.versions,
                item.vectors,
            )
            end = int(buffer_offsets[k] + span_pages[k] * PAGE_BYTES)
            buffer[at + n * self.rec_bytes : end] = 0
        await self.engine.write_batch(
            self.file, buffer, file_offsets, span_pages * PAGE_BYTES, buffer_offsets
        )
        self.counters["pages_written"] += int(buffer_pages[-1])
        self.count[pids] += np.array([len(i.ids) for i in items], np.int32)

    async def sync(self) -> None:
        await self.engine.fsync(self.file, datasync=True)

    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            **self.space.stats(),
            "postings": int((self.capacity > 0).sum()),
            "spare_buffer_bytes": sum(len(b) for b in self._spares),
        }
