"""Caller-owned I/O buffers: one view of numpy arrays, memoryviews, bytes-likes and torch tensors.

Engines never allocate the caller's data buffers; they take whatever the caller passes and reduce
it to a :class:`BufferRef` (address, size, writability, and the owner object kept alive until the
I/O finishes). :func:`aligned_empty` makes page-aligned numpy arrays for O_DIRECT.

Concurrency: BufferRef is immutable; aligned_empty and as_buffer are thread-safe (the address
cache below is a dict whose single operations are atomic; a lost race only costs a recomputation).
"""

from __future__ import annotations

import ctypes
import mmap
import weakref
from typing import Any, NamedTuple

import numpy as np

from tiers.io.byte_views import is_tensor
from tiers.io.errors import InvalidArgumentError

__all__ = ["PAGE_SIZE_BYTES", "BufferRef", "aligned_empty", "array_address", "as_buffer"]

PAGE_SIZE_BYTES = mmap.PAGESIZE
# id(view) -> (weak reference to the view, its address). ``__array_interface__`` builds a dict
# per call (~1.3 us, a tenth of a 4 KiB read's budget); a numpy *view* cannot move or resize its
# memory while it lives (``resize`` refuses arrays that do not own their data, and the base it
# holds cannot be resized under it), so its address is remembered while the weak reference says
# the same object is alive. Arrays that own their data are never cached: ``resize`` may move them.
_VIEW_ADDRESSES: dict[int, tuple[weakref.ref[np.ndarray], int]] = {}
_VIEW_CACHE_ENTRIES = 4096


class BufferRef(NamedTuple):
    """A contiguous host buffer: ``address`` .. ``address + size_bytes``.

    Invariants: the memory stays valid while ``owner`` is referenced. (A NamedTuple, not a
    dataclass: one is built per request on the hot path.)
    """

    address: int
    size_bytes: int
    writable: bool
    owner: Any

    def memoryview(self, offset_bytes: int = 0, size_bytes: int | None = None) -> memoryview:
        """A byte memoryview of part of the buffer (no copy)."""
        n = self.size_bytes - offset_bytes if size_bytes is None else size_bytes
        if n <= 0:
            return memoryview(b"")
        raw = (ctypes.c_char * n).from_address(self.address + offset_bytes)
        view = memoryview(raw).cast("B")
        return view if self.writable else view.toreadonly()


def _from_torch(tensor: Any) -> BufferRef:
    if tensor.device.type != "cpu":
        raise InvalidArgumentError(
            f"a host engine needs a CPU tensor, got device {tensor.device} (use GdsEngine)"
        )
    if not tensor.is_contiguous():
        raise InvalidArgumentError("tensor buffers must be contiguous (call .contiguous())")
    size = tensor.numel() * tensor.element_size()
    return BufferRef(int(tensor.data_ptr()), size, True, tensor)


def array_address(array: np.ndarray) -> int:
    """The address of a numpy array's first byte, remembered for views (see ``_VIEW_ADDRESSES``)."""
    if array.base is None:
        return int(array.__array_interface__["data"][0])
    key = id(array)
    hit = _VIEW_ADDRESSES.get(key)
    if hit is not None and hit[0]() is array:
        return hit[1]
    address = int(array.__array_interface__["data"][0])
    if len(_VIEW_ADDRESSES) >= _VIEW_CACHE_ENTRIES:
        _VIEW_ADDRESSES.clear()  # dead entries are never reused wrongly, only kept: drop them
    _VIEW_ADDRESSES[key] = (weakref.ref(array), address)
    return address


def _from_numpy(array: np.ndarray) -> BufferRef:
    if not array.flags.c_contiguous:
        raise InvalidArgumentError("numpy buffers must be C-contiguous")
    return BufferRef(array_address(array), array.nbytes, array.flags.writeable, array)


def as_buffer(obj: Any) -> BufferRef:
    """Reduce a caller's buffer to a BufferRef without copying.

    Accepts numpy arrays, torch CPU tensors, memoryview, bytearray, bytes, mmap and anything else
    exporting the buffer protocol as one contiguous block.

    Raises:
        InvalidArgumentError: not contiguous, not on the host, or not a buffer at all.
    """
    if isinstance(obj, BufferRef):
        return obj
    if isinstance(obj, np.ndarray):
        return _from_numpy(obj)
    if is_tensor(obj):
        return _from_torch(obj)
    try:
        view = memoryview(obj)
    except TypeError as exc:
        raise InvalidArgumentError(f"not a buffer: {type(obj).__name__}") from exc
    if not view.c_contiguous:
        raise InvalidArgumentError("buffers must be C-contiguous")
    # np.frombuffer gives the address without copying and works for read-only buffers too.
    array = np.frombuffer(view, dtype=np.uint8) if view.nbytes else np.empty(0, np.uint8)
    address = array.__array_interface__["data"][0]
    return BufferRef(address, view.nbytes, not view.readonly, (obj, array))


def aligned_empty(
    size_bytes: int, alignment_bytes: int = PAGE_SIZE_BYTES, dtype: Any = np.uint8
) -> np.ndarray:
    """An uninitialised C-contiguous numpy array starting on an ``alignment_bytes`` boundary.

    Requires: ``alignment_bytes`` is a power of two; ``size_bytes`` a multiple of the dtype size.
    """
    if alignment_bytes <= 0 or alignment_bytes & (alignment_bytes - 1):
        raise InvalidArgumentError(f"alignment must be a power of two, got {alignment_bytes}")
    itemsize = np.dtype(dtype).itemsize
    if size_bytes < 0 or size_bytes % itemsize:
        raise InvalidArgumentError(f"size {size_bytes} is not a multiple of {itemsize}")
    raw = np.empty(size_bytes + alignment_bytes, dtype=np.uint8)
    start = (-raw.__array_interface__["data"][0]) % alignment_bytes
    return raw[start : start + size_bytes].view(dtype)
