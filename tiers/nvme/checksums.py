"""CRC-32 of record payloads: libdeflate's where installed (libtiff needs it), else zlib's.

Both compute zlib's IEEE CRC-32, so records written with one check with the other. libdeflate's
is 4-6x zlib 1.2's speed (a 64 KiB get spent ~25 us in zlib); called through ctypes it costs
~0.35 us of call overhead, and finding a numpy array's address (``ctypes.data``) another ~0.8 us,
so below 16 KiB zlib wins unless the caller already knows the address (``crc32_at``: a batched
read knows every record's address from the rows it gave the engine).

Concurrency: pure functions over caller-owned buffers; safe from any thread (a CDLL call and
zlib both release the GIL on large buffers).
"""

from __future__ import annotations

import ctypes
import zlib
from collections.abc import Callable

import numpy as np

__all__ = ["crc32_at", "crc32_many", "payload_crc32"]


def _load_fast_crc32() -> Callable[[int, int, int], int] | None:
    """libdeflate_crc32(crc, address, length), or None; a CDLL call releases the GIL."""
    for name in ("libdeflate.so.0", "libdeflate.so"):
        try:
            function = ctypes.CDLL(name).libdeflate_crc32
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_uint32
        function.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
        if function(0, ctypes.c_char_p(b"123456789"), 9) == zlib.crc32(b"123456789"):
            return function
    return None


_FAST_CRC32 = _load_fast_crc32()
_FAST_CRC_MIN_BYTES = 16 << 10  # below this, finding the address costs more than zlib's loop


def payload_crc32(payload: np.ndarray | memoryview | bytes) -> int:
    if isinstance(payload, np.ndarray):
        size = payload.nbytes
        if size >= _FAST_CRC_MIN_BYTES and _FAST_CRC32 is not None and payload.flags.c_contiguous:
            return _FAST_CRC32(0, payload.ctypes.data, size)
        return zlib.crc32(payload.data) & 0xFFFFFFFF
    return zlib.crc32(payload) & 0xFFFFFFFF


def crc32_at(payload: np.ndarray, address_bytes: int) -> int:
    """CRC-32 of a contiguous uint8 ``payload`` that starts at ``address_bytes`` (the caller
    knows it): libdeflate at any size, as the address costs nothing here."""
    fast = _FAST_CRC32
    if fast is not None:
        return int(fast(0, address_bytes, payload.nbytes))
    return zlib.crc32(payload.data) & 0xFFFFFFFF


def crc32_many(addresses_bytes: np.ndarray, sizes_bytes: np.ndarray) -> np.ndarray | None:
    """CRC-32 of each of many contiguous payloads (where each starts, its size), or None
    without libdeflate (the caller sums views with zlib)."""
    fast = _FAST_CRC32
    if fast is None:
        return None
    pairs = zip(addresses_bytes.tolist(), sizes_bytes.tolist(), strict=True)
    return np.fromiter((fast(0, a, n) for a, n in pairs), np.int64, len(sizes_bytes))
