"""MemoryBudget: how an index spends the memory it is given.

A disk index is chosen because memory is short, so the memory it may use is a setting
(``SpannIndex.open(..., memory_budget_bytes=)``), not whatever it happens to touch. The budget
is spent in this order:

1. the resident part the index cannot work without: the heads (navigator), the version map and
   the lists' directory (``fixed_bytes``). The heads' bfloat16 copy (a faster head scan for
   batches: head_scan.py) is dropped unless what is left is four times its size. When they
   alone exceed the budget the index still opens (it cannot answer without them) and says so:
   ``stats()["memory_over_budget"]``;
2. the search read buffers: two (a search overlaps two chunks' reads), each an eighth of what
   is left, from ``MIN_READ_BUFFER_BYTES`` (one query's lists, with room to spare) to
   ``MAX_READ_BUFFER_BYTES``. A batch whose lists do not fit is searched a chunk at a time, and
   what a chunk computes at once (distances to heads and to list members, their sorts) is held
   to about a read buffer's size (search._cell_budget, Navigator.scan_queries);
3. everything left caches hot posting lists (ListCache, a DRAM tier), if it is at least
   ``MIN_CACHE_BYTES``.

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

__all__ = ["MAX_READ_BUFFER_BYTES", "MIN_READ_BUFFER_BYTES", "MemoryBudget"]

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


class MemoryBudget:
    def __init__(self, budget_bytes: int | None) -> None:
        self.budget_bytes = budget_bytes
        self.fixed_bytes = 0
        self.read_buffer_bytes: int | None = None  # None: search's own default
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
        left = max(0, self.budget_bytes - self.fixed_bytes - slack)
        read = min(max(left // 8, MIN_READ_BUFFER_BYTES), MAX_READ_BUFFER_BYTES)
        read = min(read, default_read_buffer_bytes)
        self.read_buffer_bytes = read
        # a head scan's [queries, heads] distances, positions and partial sort: ~16 B a cell
        navigator.scan_queries = max(1, read // 4 // (16 * max(navigator.n_heads, 1)))
        index.store.spare_limit_bytes = read
        # the second read buffer only overlaps a big batch's chunks; at the floor, keep one
        index.store.spare_count = 1 if read <= MIN_READ_BUFFER_BYTES else 2
        cache_bytes = max(0, left - _READ_BUFFERS * read)
        if cache_bytes < MIN_CACHE_BYTES:
            cache_bytes = 0
        old = self.cache.capacity_bytes
        if abs(cache_bytes - old) > old // 10 or (cache_bytes == 0) != (old == 0):
            await self.cache.aclose()
            self.cache = ListCache(cache_bytes)
        index.store.cache = self.cache if self.cache.capacity_bytes else None
        trim_heap()  # what opening or building needed only while it ran

    def after_batch(self) -> None:
        """A large batch's scratch is free: under a budget, give it back to the OS."""
        if self.budget_bytes is not None:
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

    def stats(self) -> dict[str, Any]:
        over = self.budget_bytes is not None and self.fixed_bytes > self.budget_bytes
        return {
            "memory_budget_bytes": self.budget_bytes,
            "memory_fixed_bytes": self.fixed_bytes,
            "memory_over_budget": over,
            "read_buffer_bytes": self.read_buffer_bytes,
            **self.cache.stats(),
        }

    async def aclose(self) -> None:
        await self.cache.aclose()
