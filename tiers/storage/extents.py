"""ExtentAllocator: aligned byte ranges carved from one arena, with holes reused and merged.

Segregated fit: free extents sit in power-of-two size classes, so an allocation looks at a few
classes, not every hole; a freed extent merges at once with free neighbours on both sides, so
fragmentation cannot grow without bound (two adjacent holes never coexist). Used by every tier:
DRAM/HBM/CXL arenas and NVMe extent files alike. An arena whose backing grows (extent files that
are extended as they fill) starts with nothing free (``all_free=False``) and frees each part as
it comes to exist; a freed part merges with the free tail before it, which
``free_bytes_before`` measures so a grower knows how much more a request needs.

Concurrency: not thread-safe; one owner (a tier, in its loop thread).
Invariants: free extents are disjoint, aligned, and never adjacent; ``free_bytes`` is their sum.
"""

from __future__ import annotations

from tiers.io.errors import InvalidArgumentError

__all__ = ["ExtentAllocator"]


class ExtentAllocator:
    """Allocates ``alignment_bytes``-aligned extents from ``[0, capacity_bytes)``; with
    ``all_free=False`` nothing is free until ``free`` hands parts of the arena in."""

    def __init__(
        self, capacity_bytes: int, alignment_bytes: int = 64, *, all_free: bool = True
    ) -> None:
        if alignment_bytes <= 0 or alignment_bytes & (alignment_bytes - 1):
            raise InvalidArgumentError(f"alignment must be a power of two: {alignment_bytes}")
        self.alignment_bytes = alignment_bytes
        self.capacity_bytes = capacity_bytes - capacity_bytes % alignment_bytes
        self._by_start: dict[int, int] = {}  # start -> size of each free extent
        self._by_end: dict[int, int] = {}  # end -> start
        self._classes: list[set[int]] = [set() for _ in range(64)]  # size class -> starts
        self.free_bytes = 0
        if self.capacity_bytes and all_free:
            self._add(0, self.capacity_bytes)

    def rounded(self, size_bytes: int) -> int:
        """The bytes an allocation of ``size_bytes`` really takes (at least one unit)."""
        mask = self.alignment_bytes - 1
        return max(self.alignment_bytes, (size_bytes + mask) & ~mask)

    def allocate(self, size_bytes: int) -> int | None:
        """Start of a new extent of ``rounded(size_bytes)`` bytes, or None if no hole fits."""
        need = self.rounded(size_bytes)
        first_class = need.bit_length() - 1
        for cls in range(first_class, 64):
            starts = self._classes[cls]
            if not starts:
                continue
            if cls == first_class:  # the smallest class may hold holes that are too small
                start = min((s for s in starts if self._by_start[s] >= need), default=None)
                if start is None:
                    continue
            else:
                start = min(starts)  # lowest address: keeps the arena compact
            size = self._by_start[start]
            self._remove(start, size)
            if size > need:
                self._add(start + need, size - need)
            return start
        return None

    def free(self, start: int, size_bytes: int) -> None:
        """Return an extent given by ``allocate`` (with the same size asked)."""
        size = self.rounded(size_bytes)
        if start % self.alignment_bytes or start < 0 or start + size > self.capacity_bytes:
            raise InvalidArgumentError(f"free of an extent outside the arena: {start}+{size}")
        if start in self._by_start or (start + size) in self._by_end:
            raise InvalidArgumentError(f"double free of extent {start}+{size}")
        left = self._by_end.get(start)
        if left is not None:  # merge with the free extent just before
            left_size = self._by_start[left]
            self._remove(left, left_size)
            start, size = left, size + left_size
        right_size = self._by_start.get(start + size)
        if right_size is not None:  # and with the one just after
            self._remove(start + size, right_size)
            size += right_size
        self._add(start, size)

    def free_bytes_before(self, address: int) -> int:
        """Size of the free extent that ends exactly at ``address`` (0 when none does)."""
        start = self._by_end.get(address)
        return 0 if start is None else address - start

    def largest_free(self) -> int:
        for cls in range(63, -1, -1):
            if self._classes[cls]:
                return max(self._by_start[s] for s in self._classes[cls])
        return 0

    def _add(self, start: int, size: int) -> None:
        self._by_start[start] = size
        self._by_end[start + size] = start
        self._classes[size.bit_length() - 1].add(start)
        self.free_bytes += size

    def _remove(self, start: int, size: int) -> None:
        del self._by_start[start]
        del self._by_end[start + size]
        self._classes[size.bit_length() - 1].discard(start)
        self.free_bytes -= size
