"""MemoryBudget: how an index spends the memory it is given.

A disk index is chosen because memory is short, so the memory it may use is a setting
(``SpannIndex.open(..., memory_budget_bytes=)``), not whatever it happens to touch. The budget
is spent in this order:

1. the resident part the index cannot work without: the heads (navigator), the version map and
   the lists' directory (``fixed_bytes``). When they alone exceed the budget the index still
   opens (it cannot answer without them) and says so: ``stats()["memory_over_budget"]``;
2. the search read buffers: two (a search overlaps two chunks' reads), each a quarter of what is
   left, at least ``MIN_READ_BUFFER_BYTES`` (one query's lists, with room to spare) and at most
   search.READ_BUFFER_BYTES. A batch whose lists do not fit is searched a chunk at a time;
3. everything left caches hot posting lists (ListCache, a DRAM tier).

Without a budget the index keeps the buffers it always had and caches no list.
What is not counted: the interpreter and its libraries, LMDB's mapped pages, the write-ahead
log's buffer and transient per-search arrays (a few MB per 1,000 queries) -- the caller's
``memory_budget_bytes`` is what is left for the index after them.
The split is redone (``apply``) after a build, a reopen and each checkpoint, since the heads
grow with the data; the cache keeps its lists unless its share moved by more than a tenth.
Thread-safety: the index's loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vectordb.list_cache import ListCache

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["MIN_READ_BUFFER_BYTES", "MemoryBudget"]

MIN_READ_BUFFER_BYTES = 4 << 20  # a lone query reads ~0.6 MB on debian-minilm (8 lists)
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
        )

    async def apply(self, index: SpannIndex, default_read_buffer_bytes: int) -> None:
        """Split the budget again (the heads may have grown) and hand the shares out."""
        self.fixed_bytes = self.resident_bytes(index)
        if self.budget_bytes is None:
            return
        left = max(0, self.budget_bytes - self.fixed_bytes)
        read = min(max(left // 4, MIN_READ_BUFFER_BYTES), default_read_buffer_bytes)
        self.read_buffer_bytes = read
        index.store.spare_limit_bytes = read
        cache_bytes = max(0, left - _READ_BUFFERS * read)
        old = self.cache.capacity_bytes
        if abs(cache_bytes - old) > old // 10 or (cache_bytes == 0) != (old == 0):
            await self.cache.aclose()
            self.cache = ListCache(cache_bytes)
        index.store.cache = self.cache if self.cache.capacity_bytes else None

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
