"""ArenaSpace: where objects lie in a memory tier's arena: allocation, freeing, compaction.

Split from ArenaTier (which mixes it in): a put asks ``_allocate`` for an extent of the arena;
when the free space is enough in total but split into holes too small, ``_compact`` slides
objects toward offset 0, one copy each, in address order, until a hole fits, so fragmentation
never refuses a put; an overwrite that fits only once its old copy is gone drops that copy first
(the copy that follows is synchronous, so no reader can see the gap).

Concurrency: one asyncio loop thread; every method is synchronous, never spans an await.
Invariants: the extents of the objects in ``_index`` are disjoint, inside ``[0, arena_bytes)``
and allocated in ``_extents``; ``_used_bytes`` is the sum of their sizes.
"""

from __future__ import annotations

import abc

from tiers.io.errors import CapacityError
from tiers.storage.extents import ExtentAllocator

__all__ = ["ArenaSpace"]


class ArenaSpace(abc.ABC):
    """Mixed into ArenaTier; the attributes below are the tier's."""

    name: str
    arena_bytes: int
    compactions: int
    compacted_bytes: int
    _extents: ExtentAllocator
    _index: dict[str, tuple[int, int]]  # key -> (arena offset, size in bytes)
    _used_bytes: int

    @abc.abstractmethod
    def _move(self, dst_offset_bytes: int, src_offset_bytes: int, size_bytes: int) -> None:
        """Copy bytes within the arena toward lower offsets; the ranges may overlap."""

    def _free(self, offset: int, size: int) -> None:
        if size:
            self._extents.free(offset, size)

    def _drop(self, key: str) -> bool:
        entry = self._index.pop(key, None)
        if entry is None:
            return False
        self._free(*entry)
        self._used_bytes -= entry[1]
        return True

    def _allocate(self, key: str, size: int) -> int:
        """Arena offset of a new extent for ``size`` bytes; compacts or raises CapacityError."""
        if not size:
            return 0
        offset = self._extents.allocate(size)
        if offset is not None:
            return offset
        need = self._extents.rounded(size)
        if self._extents.free_bytes < need:
            old = self._index.get(key)
            old_extent_bytes = self._extents.rounded(old[1]) if old and old[1] else 0
            if self._extents.free_bytes + old_extent_bytes < need:
                raise CapacityError(
                    f"tier {self.name!r}: no room in the arena for {size} bytes "
                    f"({self._extents.free_bytes} of {self.arena_bytes} arena bytes free)"
                )
            # Only the old copy of this key stands in the way. The copy that follows is
            # synchronous, so dropping the old copy first exposes no gap to any reader; if that
            # copy fails, the key is gone rather than half-written.
            self._drop(key)
            offset = self._extents.allocate(size)
            if offset is not None:
                return offset
        self._compact(need)
        offset = self._extents.allocate(size)
        if offset is None:  # _compact guarantees a hole of ``need`` bytes
            raise AssertionError("arena compaction left no hole large enough")
        return offset

    def _compact(self, need_bytes: int) -> None:
        """Slide objects, in address order, toward offset 0 until a hole of ``need_bytes`` exists.

        Rebuilds the allocator: a fresh one hands out extents in address order, and objects left in
        place are re-reserved at their offsets by allocating (then freeing) a filler for each gap.
        """
        old_extents = self._extents
        fresh = ExtentAllocator(self.arena_bytes, old_extents.alignment_bytes)
        entries = sorted((off, size, key) for key, (off, size) in self._index.items() if size)
        fillers: list[tuple[int, int]] = []
        end = 0  # first offset past what has been laid out
        moving = True
        for offset, size, key in entries:
            if moving and offset - end >= need_bytes:
                moving = False  # the hole before this object is large enough: leave the rest
            if moving:
                if offset != end:
                    self._move(end, offset, size)
                    self._index[key] = (end, size)
                    self.compacted_bytes += size
                offset = end
            elif offset > end:
                if fresh.allocate(offset - end) != end:
                    raise AssertionError("arena compaction lost track of a gap")
                fillers.append((end, offset - end))
            if fresh.allocate(size) != offset:
                raise AssertionError("arena compaction lost track of an extent")
            end = offset + fresh.rounded(size)
        for offset, size in fillers:
            fresh.free(offset, size)
        self._extents = fresh
        self.compactions += 1
