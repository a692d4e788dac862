"""CRC-32 of record payloads: libdeflate's where installed (libtiff needs it), else zlib's.

Both compute zlib's IEEE CRC-32, so records written with one check with the other. libdeflate's
is 4-6x zlib 1.2's speed (a 64 KiB get spent ~25 us in zlib); called through ctypes it costs
~0.35 us of call overhead, and finding a numpy array's address (``ctypes.data``) another ~0.8 us,
so below 16 KiB zlib wins unless the caller already knows the address (``crc32_at``: a batched
read knows every record's address from the rows it gave the engine). ``crc32_many`` sums a whole
batch in one call to a numba loop that calls libdeflate by name (0.15 us a 4 KiB payload where a
ctypes call per payload costs 0.5 us); without numba it makes those ctypes calls.

Concurrency: pure functions over caller-owned buffers; safe from any thread (a CDLL call and
zlib both release the GIL on large buffers).
"""

from __future__ import annotations

import ctypes
import logging
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["crc32_at", "crc32_many", "payload_crc32", "row_checker"]

log = logging.getLogger("tierkit.tiers")


_FAST_CRC32_LIBRARY: list[str] = []  # the name libdeflate loaded under


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
            _FAST_CRC32_LIBRARY.append(name)
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
    """CRC-32 of each of many contiguous payloads (int64 arrays: where each starts, its size),
    or None without libdeflate (the caller sums views with zlib)."""
    if _FAST_CRC32 is None:
        return None
    rows = _compiled_rows()
    if rows is not None:  # one call for the batch: ~0.15 us a 4 KiB payload, not ~0.5
        out = np.empty(len(sizes_bytes), np.int64)
        rows(addresses_bytes, sizes_bytes, out)
        return out
    fast = _FAST_CRC32
    pairs = zip(addresses_bytes.tolist(), sizes_bytes.tolist(), strict=True)
    return np.fromiter((fast(0, a, n) for a, n in pairs), np.int64, len(sizes_bytes))


_compiled: list[Any] = []  # [the numba loop, or None], built on first use
_checker: list[Any] = []  # [crc_loop.check_rows] once the loop is built


def row_checker() -> Any:
    """``crc_loop.check_rows`` (the first row of a batch that came short or fails its CRC-32,
    or -1), or None where the compiled loop is unavailable (the caller checks another way)."""
    _compiled_rows()
    return _checker[0] if _checker else None


def _compiled_rows() -> Any:
    """A numba loop calling libdeflate_crc32 by name for every row (the library loaded into
    the JIT's symbol table, so numba's disk cache holds no address), or None."""
    if not _compiled:
        try:
            _compiled.append(_build_rows())
        except Exception as exc:  # no numba, or no libdeflate for it: a ctypes call per row
            log.info("batched CRC-32 loop unavailable, one ctypes call per payload: %r", exc)
            _compiled.append(None)
    return _compiled[0]


def _build_rows() -> Any:
    import llvmlite.binding as llvm  # type: ignore[import-untyped]

    llvm.load_library_permanently(_FAST_CRC32_LIBRARY[0])
    from tiers.nvme.crc_loop import check_rows, crc_rows  # after the library: see crc_loop

    probe = np.frombuffer(b"123456789", np.uint8)
    got = np.zeros(1, np.int64)
    addresses, sizes = np.array([probe.ctypes.data], np.int64), np.array([9], np.int64)
    crc_rows(addresses, sizes, got)
    if int(got[0]) != zlib.crc32(b"123456789"):
        raise RuntimeError("the compiled CRC-32 loop disagrees with zlib")
    if (
        check_rows(addresses, sizes, got, sizes) != -1
        or check_rows(addresses, sizes, got + 1, sizes) != 0
    ):
        raise RuntimeError("the compiled CRC-32 check disagrees with zlib")
    _checker.append(check_rows)
    return crc_rows
