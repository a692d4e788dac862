"""SlabPool: page-aligned batch buffers that are reused once nothing refers to them any more.

The default collate hands the training loop a tensor that *is* the buffer the reads landed in
(``torch.from_numpy`` over a view), so a buffer may be reused only when the caller has dropped
every batch tensor, view or slice made from it. numpy collapses view chains onto the base
array, and torch keeps the numpy array alive, so the base array's reference count says exactly
that: a slab whose count is back to the pool's own references is free. A caller who keeps
batches simply makes the pool allocate new slabs; nothing is ever overwritten under them.

Concurrency: used only by the loader's I/O thread (the reference counts it reads are updated
by other threads atomically under the GIL).
Invariants: a slab handed out by ``acquire`` is not handed out again while any reference to it
or to a view of it exists outside the pool.
"""

from __future__ import annotations

import sys

import numpy as np

from tiers.io import PAGE_SIZE_BYTES

__all__ = ["SlabPool"]

_GRANULE_BYTES = 64 * 1024  # slab sizes are rounded up to this, so batches can share slabs


def _new_slab(size_bytes: int, alignment_bytes: int) -> tuple[np.ndarray, int]:
    """An owning uint8 array with room for ``size_bytes`` from an aligned start, and that start."""
    raw = np.empty(size_bytes + alignment_bytes, np.uint8)
    return raw, (-raw.__array_interface__["data"][0]) % alignment_bytes


def _free_refcount() -> int:
    """The reference count a slab has when only the pool's list holds it (measured, not assumed)."""
    probe = [_new_slab(PAGE_SIZE_BYTES, PAGE_SIZE_BYTES)]
    return sys.getrefcount(probe[0][0])


class SlabPool:
    """Keeps at most ``max_slabs`` slabs; more are allocated when all are in use, then dropped."""

    def __init__(self, max_slabs: int = 16, alignment_bytes: int = PAGE_SIZE_BYTES) -> None:
        self.max_slabs = max_slabs
        self.alignment_bytes = alignment_bytes
        self._slabs: list[tuple[np.ndarray, int]] = []  # (owning array, aligned start)
        self._free_refs = _free_refcount()
        self.allocated = 0  # slabs created over the pool's life (a test and stats figure)

    def acquire(self, size_bytes: int) -> np.ndarray:
        """A writable, aligned uint8 array of exactly ``size_bytes`` (a view of a free slab)."""
        slabs = self._slabs
        need = size_bytes + self.alignment_bytes
        for i in range(len(slabs)):
            if slabs[i][0].nbytes >= need and sys.getrefcount(slabs[i][0]) <= self._free_refs:
                start = slabs[i][1]
                return slabs[i][0][start : start + size_bytes]
        rounded = -(-max(size_bytes, 1) // _GRANULE_BYTES) * _GRANULE_BYTES
        raw, start = _new_slab(rounded, self.alignment_bytes)
        self.allocated += 1
        if len(slabs) < self.max_slabs:
            slabs.append((raw, start))
        else:
            self._replace_smallest_free((raw, start))
        return raw[start : start + size_bytes]

    def _replace_smallest_free(self, entry: tuple[np.ndarray, int]) -> None:
        """Swap ``entry`` for the smallest free slab, so the pool tracks the sizes in use."""
        slabs = self._slabs
        free = [i for i in range(len(slabs)) if self._is_free(i)]
        if free:
            smallest = min(free, key=lambda i: slabs[i][0].nbytes)
            if slabs[smallest][0].nbytes < entry[0].nbytes:
                slabs[smallest] = entry

    def in_use(self) -> int:
        """Slabs of the pool that something outside it still refers to."""
        return sum(1 for i in range(len(self._slabs)) if not self._is_free(i))

    def _is_free(self, i: int) -> bool:
        return sys.getrefcount(self._slabs[i][0]) <= self._free_refs

    def clear(self) -> None:
        """Forget every slab (memory goes when the last outside view does)."""
        self._slabs.clear()
