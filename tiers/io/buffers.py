"""Caller-owned I/O buffers: one view of numpy arrays, memoryviews, bytes-likes and torch tensors.

Engines never allocate the caller's data buffers; they take whatever the caller passes and reduce
it to a :class:`BufferRef` (address, size, writability, and the owner object kept alive until the
I/O finishes). :func:`aligned_empty` makes page-aligned numpy arrays for O_DIRECT.

Concurrency: BufferRef is immutable; aligned_empty is thread-safe.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any, NamedTuple

import numpy as np

from tiers.io.byte_views import is_tensor
from tiers.io.errors import InvalidArgumentError

__all__ = ["PAGE_SIZE_BYTES", "BufferRef", "aligned_empty", "as_buffer"]

PAGE_SIZE_BYTES = mmap.PAGESIZE


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


def _from_numpy(array: np.ndarray) -> BufferRef:
    if not array.flags.c_contiguous:
        raise InvalidArgumentError("numpy buffers must be C-contiguous")
    return BufferRef(
        array.__array_interface__["data"][0], array.nbytes, array.flags.writeable, array
    )


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
