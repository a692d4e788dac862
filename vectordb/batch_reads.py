"""BatchReads: the posting reads of one search batch, laid out one after another in one buffer.

A large batch starts reading lists while its head scan is still running (search.py): the lists
of the first queries go out as soon as those queries are navigated, the rest once the whole
batch is. Every list is read once per batch, whichever read brought it; the reads share one
page-aligned buffer (the store's reusable spare: fresh memory is slow to touch), each read
taking the next free part of it.

The lists of all reads, in the order the reads were started, form the batch's list order
(``pids``): list ``i`` of the batch is list ``i - offset`` of the read that holds it.

Invariants: a list id appears in at most one read; a part is never handed out twice; the buffer
goes back to the store (``release``) only after every read has finished.
Thread-safety: loop thread only (the buffer's bytes may be read by the scoring thread).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing

import numpy as np

from tiers.io import aligned_empty
from vectordb.list_cache import ListCache
from vectordb.posting_format import PAGE_BYTES
from vectordb.posting_reads import BRIDGE_BYTES, PostingRead
from vectordb.posting_store import PostingStore

__all__ = ["BRIDGE_PAGES", "BatchReads", "buffer_bytes", "in_file_order"]

BRIDGE_PAGES = BRIDGE_BYTES // PAGE_BYTES


def in_file_order(store: PostingStore, pids: np.ndarray) -> np.ndarray:
    """``pids`` sorted by where their lists start in the file (the order a read takes them)."""
    pids = np.asarray(pids, np.int64)
    return pids[np.argsort(store.start[pids], kind="stable")]


def buffer_bytes(store: PostingStore, pids: np.ndarray, bridge_pages: int = BRIDGE_PAGES) -> int:
    """The buffer a BatchReads needs to read ``pids`` at once, gaps included."""
    return (store.read_pages(in_file_order(store, pids), bridge_pages) + 1) * PAGE_BYTES


class BatchReads:
    def __init__(
        self, store: PostingStore, capacity_bytes: int, bridge_pages: int = BRIDGE_PAGES
    ) -> None:
        """``capacity_bytes``: the shared buffer's size (taken from the store on first use).
        ``bridge_pages``: reads run through gaps up to this long (posting_reads) where the
        buffer has room for them."""
        self._store = store
        self._capacity_bytes = capacity_bytes
        self._bridge_pages = bridge_pages
        self._buffer: np.ndarray | None = None
        self._used_bytes = 0
        self.reads: list[PostingRead] = []
        self.offsets: list[int] = []  # batch list index of each read's first list
        self._pids: list[np.ndarray] = []

    @property
    def pids(self) -> np.ndarray:
        """Every list started so far, in batch order."""
        return np.concatenate(self._pids) if self._pids else np.zeros(0, np.int64)

    @property
    def longest(self) -> int:
        """Records in the longest list started so far."""
        return max((int(read.counts.max(initial=0)) for read in self.reads), default=0)

    def fits(self, pids: np.ndarray) -> bool:
        """Whether a read of ``pids`` fits in what is left of the buffer (without gaps)."""
        return self._fits(in_file_order(self._store, pids), 0)

    def _fits(self, pids: np.ndarray, bridge_pages: int) -> bool:
        pages = self._store.read_pages(pids, bridge_pages) + 1  # + PostingRead's spare page
        return self._used_bytes + pages * PAGE_BYTES <= self._capacity_bytes

    def _carve(self, size_bytes: int) -> np.ndarray:
        if self._used_bytes + size_bytes > self._capacity_bytes:
            return aligned_empty(size_bytes)  # a miscount: correct, only slower
        if self._buffer is None:
            self._buffer = self._store.take_buffer(self._capacity_bytes)
        part = self._buffer[self._used_bytes : self._used_bytes + size_bytes]
        self._used_bytes += size_bytes
        return part

    def start(self, pids: np.ndarray, n_groups: int = 1) -> None:
        """Start reading ``pids`` (unique, none already started) into the next part, in the
        order of their place in the file (lists back to back there are read together)."""
        if len(pids) == 0:
            return
        pids = in_file_order(self._store, pids)
        bridge = self._bridge_pages if self._fits(pids, self._bridge_pages) else 0
        self.offsets.append(sum(len(p) for p in self._pids))
        self._pids.append(pids)
        read = self._store.begin_read(pids, n_groups, allocate=self._carve, bridge_pages=bridge)
        self.reads.append(read)

    def start_missing(self, pids: np.ndarray, n_groups: int) -> None:
        """Start reading those of ``pids`` (unique) not started yet."""
        self.start(np.setdiff1d(pids, self.pids, assume_unique=True), n_groups)

    async def groups(self) -> AsyncGenerator[tuple[PostingRead, int, int, int], None]:
        """``(read, batch index of first, first, stop)`` per landed group of lists, unverified
        (see PostingRead.groups), read by read."""
        for read, offset in zip(self.reads, self.offsets, strict=True):
            async with aclosing(read.groups(verified=False)) as groups:
                async for first, stop in groups:
                    yield read, offset + first, first, stop

    async def offer_to(self, cache: ListCache, corrupt: np.ndarray) -> None:
        """Offer the lists read from the device to ``cache``; only once they have been
        checked, and not those of batch indexes ``corrupt``."""
        for read, offset in zip(self.reads, self.offsets, strict=True):
            fresh = ~read.cached & (read.page_counts > 0)
            mine = corrupt[(corrupt >= offset) & (corrupt < offset + len(read.pids))]
            fresh[mine - offset] = False
            lists = np.flatnonzero(fresh)
            if len(lists):
                pids, counts = read.pids[lists], read.counts[lists]
                await cache.admit(pids, read.file_pages[lists], counts, read.page_views(lists))

    async def finish(self) -> None:
        """Wait for every read (errors retrieved, not raised)."""
        for read in self.reads:
            await read.finish()

    def release(self) -> None:
        """Hand the buffer back for the next batch: only once every read has finished and no
        view of the buffer is used any more."""
        if self._buffer is not None:
            self._store.recycle(self._buffer)
            self._buffer = None
