"""MemoryBudget: how an index spends the memory it is given.

A disk index is chosen because memory is short, so the memory it may use is a setting
(``SpannIndex.open(..., memory_budget_bytes=)``), not whatever it happens to touch. The budget
is spent in this order:

1. the resident part the index cannot work without: the heads (navigator), the version map and
   the lists' directory (``fixed_bytes``). The heads' bfloat16 copy (a faster head scan for
   batches: head_scan.py) is dropped unless what is left is four times its size. When they
   and the floors below exceed the budget the index still opens (it cannot answer without
   them) and says so: ``stats()["memory_over_budget"]`` (``memory_split_bytes``: the sum);
2. the search read buffers: two (a search overlaps two chunks' reads), each an eighth of what
   is left, from ``MIN_READ_BUFFER_BYTES`` (one query's lists, with room to spare) to
   ``MAX_READ_BUFFER_BYTES``. A batch whose lists do not fit is searched a chunk at a time, and
   what a chunk computes at once (distances to heads and to list members, their sorts) is held
   to about a read buffer's size (search._cell_budget, Navigator.scan_queries);
3. the search scratch: a read buffer's worth per chunk in flight (the chunk's distance
   matrices), which also bounds a gathered batch's own arrays (``batch_queries``: queries of
   concurrent callers searched together) and the heads widened at a time (Navigator.widen_heads);
4. everything left caches hot posting lists (ListCache, a DRAM tier), if it is at least
   ``MIN_CACHE_BYTES``.

At the floor (``tight``: the read buffer at ``MIN_READ_BUFFER_BYTES``) a search runs one chunk
at a time, keeps one read buffer (a chunk that needs a larger one frees it first) and one
gathered batch in flight, and the heap is trimmed after every batch, gathered ones included:
measured on debian-minilm in a 13.7 MiB cgroup, two chunks in flight, a kept spare beside a
fresh buffer and 384 KiB of widened heads per thread took the process over its limit.

Without a budget the index keeps the buffers it always had and caches no list.
What is not counted: the interpreter and its libraries, LMDB's mapped pages, the write-ahead
log's buffer and transient per-search arrays (a few MB per 1,000 queries) -- the caller's
``memory_budget_bytes`` is what is left for the index after them.
The split is redone (``apply``) after a build, a reopen and each checkpoint, since the heads
grow with the data; the cache keeps its lists unless its share moved by more than a tenth.
The C allocator keeps what a search or an open freed for later: under a budget the process's
big blocks are unmapped when freed (tiers.io.cap_heap_retention, process-wide) and the heaps
are trimmed (tiers.io.trim_heap) after an open, a build, a checkpoint and every batch of more
than a few queries.
Thread-safety: the index's loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tiers.io import cap_heap_retention, trim_heap
from vectordb.list_cache import ListCache

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["MAX_BATCH_QUERIES", "MAX_READ_BUFFER_BYTES", "MIN_READ_BUFFER_BYTES", "MemoryBudget"]

MAX_READ_BUFFER_BYTES = 64 << 20  # past this, bigger chunks gain a batch little (measured)
# what is not counted piece by piece (the page cache of the metadata and log files, small
# arrays, a search's bookkeeping) is kept out of the split: an eighth of the budget, at least
# this (measured on debian-minilm: in a 183 MiB cgroup 22 MiB of page cache beside the split;
# in a 27 MiB one ~6-9 MiB of scratch, threads and Python objects beside the split)
MIN_SLACK_BYTES = 6 << 20
MIN_CACHE_BYTES = 16 << 20  # a smaller list cache holds a few lists: its share is slack instead
COMPACT_BELOW = 3  # budget / heads' float32 bytes under which the heads are held in float16
MIN_READ_BUFFER_BYTES = 1 << 20  # a lone query reads ~0.75 MB on debian-minilm (10 lists)
_READ_BUFFERS = 2  # search.py keeps two chunks' reads in flight
MAX_BATCH_QUERIES = 256  # a gathered batch's queries without a budget (gather.py)
MIN_BATCH_QUERIES = 16  # ... and under the tightest one: one small caller's search at least
# a gathered query's own arrays: its vector ~3 times (the callers', the batch's, the chunk's
# copy) and ~14 B per candidate list (ids, distances, masks; twice ``max_postings``)
_BATCH_COPIES = 3
_CANDIDATE_BYTES = 14 * 2 * 16


class MemoryBudget:
    def __init__(self, budget_bytes: int | None) -> None:
        self.budget_bytes = budget_bytes
        self.fixed_bytes = 0
        self.read_buffer_bytes: int | None = None  # None: search's own default
        self.chunks_in_flight = _READ_BUFFERS  # search.py: chunks whose reads overlap
        self.scratch_bytes = 0  # a search's transient arrays at once (0: not bounded)
        self.batch_queries = MAX_BATCH_QUERIES  # queries of a gathered batch, at most
        self.slack_bytes = 0
        self.cache = ListCache(0)

    @staticmethod
    def resident_bytes(index: SpannIndex) -> int:
        """Bytes the index holds in memory whatever it does: heads, versions, directory."""
        return (
            index.navigator.resident_bytes()
            + index.versions.resident_bytes()
            + sum(a.nbytes for a in index.store.snapshot().values())
            + (index.tenancy.resident_bytes() if index.tenancy is not None else 0)
        )

    async def apply(self, index: SpannIndex, default_read_buffer_bytes: int) -> None:
        """Split the budget again (the heads may have grown) and hand the shares out."""
        self.fixed_bytes = self.resident_bytes(index)
        if self.budget_bytes is None:
            return
        cap_heap_retention()  # freed scratch goes back to the OS, not to malloc's heaps
        navigator = index.navigator
        if (
            navigator.allow_bfloat16
            and self.budget_bytes - self.fixed_bytes < 4 * navigator.bfloat16_bytes()
        ):
            navigator.drop_bfloat16()  # a faster batch head scan is not worth a tight budget
            self.fixed_bytes = self.resident_bytes(index)
        slack = max(self.budget_bytes // 8, MIN_SLACK_BYTES)
        self.slack_bytes = slack
        left = max(0, self.budget_bytes - self.fixed_bytes - slack)
        read = min(max(left // 8, MIN_READ_BUFFER_BYTES), MAX_READ_BUFFER_BYTES)
        read = min(read, default_read_buffer_bytes)
        self.read_buffer_bytes = read
        # at the floor one chunk at a time: its read buffer and distance matrices, no second
        self.chunks_in_flight = 1 if self.tight else _READ_BUFFERS
        self.scratch_bytes = self.chunks_in_flight * read
        # a head scan's [queries, heads] distances, positions and partial sort: ~16 B a cell
        navigator.scan_queries = max(1, read // 4 // (16 * max(navigator.n_heads, 1)))
        # float16 heads are widened a piece at a time, into each thread's kept scratch
        navigator.widen_heads = max(16, min(256, read // 8 // (4 * navigator.dim)))
        per_query = _BATCH_COPIES * 4 * navigator.dim + _CANDIDATE_BYTES
        batch = self.scratch_bytes // 2 // per_query
        self.batch_queries = max(MIN_BATCH_QUERIES, min(MAX_BATCH_QUERIES, batch))
        for gatherer in (index.gatherer, index.tenant_gatherer):  # made before this split
            if gatherer is not None:
                gatherer.max_batch_queries = self.batch_queries
                gatherer.max_in_flight = self.chunks_in_flight
        index.store.spare_limit_bytes = read
        index.store.spare_count = self.chunks_in_flight  # a buffer per chunk in flight
        cache_bytes = max(0, left - self.chunks_in_flight * read - self.scratch_bytes)
        if cache_bytes < MIN_CACHE_BYTES:
            cache_bytes = 0
        old = self.cache.capacity_bytes
        if abs(cache_bytes - old) > old // 10 or (cache_bytes == 0) != (old == 0):
            await self.cache.aclose()
            self.cache = ListCache(cache_bytes)
        index.store.cache = self.cache if self.cache.capacity_bytes else None
        trim_heap()  # what opening or building needed only while it ran

    def after_batch(self, n_queries: int, small_queries: int) -> None:
        """A batch's scratch is free: under a budget, give it back to the OS after a batch of
        more than ``small_queries`` queries, and after every batch at the floor (gathered
        callers' batches follow each other: freed pages in a thread's heap would add up)."""
        if self.budget_bytes is not None and (n_queries > small_queries or self.tight):
            trim_heap()

    def narrow(self, name: str, stored_bytes: int) -> Any:
        """How load_checkpoint holds an array: the heads in float16 when the budget is under
        ``COMPACT_BELOW`` x their float32 bytes (half the memory; distances to heads then carry
        float16's rounding, ~3 significant digits, which only orders the lists a query reads).
        A checkpoint written meanwhile stores the rounded heads."""
        tight = self.budget_bytes is not None and self.budget_bytes < COMPACT_BELOW * stored_bytes
        return np.float16 if name == "head_vectors" and tight else None

    @property
    def tight(self) -> bool:
        """The read buffers are at their floor: one batch at a time (search.py's gathering)."""
        return (
            self.read_buffer_bytes is not None and self.read_buffer_bytes <= MIN_READ_BUFFER_BYTES
        )

    def split_bytes(self) -> int:
        """What the split hands out: the resident part, read buffers and scratch per chunk in
        flight, the list cache and the slack (above the budget when even its floors do not fit:
        the index then runs at the floor and says it is over)."""
        buffers = self.chunks_in_flight * (self.read_buffer_bytes or 0)
        cache = self.cache.capacity_bytes
        return self.fixed_bytes + buffers + self.scratch_bytes + cache + self.slack_bytes

    def stats(self) -> dict[str, Any]:
        over = self.budget_bytes is not None and self.split_bytes() > self.budget_bytes
        return {
            "memory_budget_bytes": self.budget_bytes,
            "memory_fixed_bytes": self.fixed_bytes,
            "memory_over_budget": over,
            "memory_split_bytes": self.split_bytes() if self.budget_bytes is not None else None,
            "read_buffer_bytes": self.read_buffer_bytes,
            # the split: read buffers and scratch per chunk in flight, and the slack kept for
            # what is not counted piece by piece
            "read_buffers_in_flight": self.chunks_in_flight,
            "memory_scratch_bytes": self.scratch_bytes,
            "memory_slack_bytes": self.slack_bytes,
            "gathered_batch_queries_max": self.batch_queries,
            **self.cache.stats(),
        }

    async def empty_cache(self, index: SpannIndex) -> None:
        """Forget every cached list (a cold start without reopening: a benchmark's passes)."""
        capacity = self.cache.capacity_bytes
        await self.cache.aclose()
        self.cache = ListCache(capacity)
        index.store.cache = self.cache if capacity else None
        trim_heap()

    async def aclose(self) -> None:
        await self.cache.aclose()
