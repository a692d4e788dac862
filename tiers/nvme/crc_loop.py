"""The batched CRC-32 loop: numba, calling libdeflate's ``libdeflate_crc32`` by name.

Why a module of its own: numba's disk cache keys a function by its module and source, and a
closure over a per-process ``ExternalFunction`` object got a new cache entry in every process
(a recompile of ~0.2-0.5 s at each start, and a ``__pycache__`` that grew by one file per
process). Declared here at module level, like ``tiers/io/uring/reap_loop.py``'s ``syscall``,
the symbol is resolved by name when the cached code is linked, so one cache entry serves every
process.

Precondition: import this module only after ``llvmlite.binding.load_library_permanently`` has
loaded libdeflate (``checksums._build_rows`` does), or linking the loop fails.
Concurrency: ``crc_rows`` and ``check_rows`` are ``nogil`` and pure over caller-owned arrays.
"""

from __future__ import annotations

from typing import Any

from numba import njit, types

__all__ = ["check_rows", "crc_rows"]

_crc: Any = types.ExternalFunction(
    "libdeflate_crc32", types.uint32(types.uint32, types.uint64, types.uint64)
)


@njit(nogil=True, cache=True)
def crc_rows(addresses: Any, sizes: Any, out: Any) -> None:  # pragma: no cover - machine code
    """out[i] = CRC-32 of the ``sizes[i]`` bytes at address ``addresses[i]`` (int64 arrays)."""
    for i in range(addresses.shape[0]):
        out[i] = _crc(0, addresses[i], sizes[i])


@njit(nogil=True, cache=True)
def check_rows(addresses: Any, sizes: Any, expected: Any, moved: Any) -> int:  # pragma: no cover
    """The first row whose read came short (``moved[i] < sizes[i]``) or whose ``sizes[i]``
    bytes at ``addresses[i]`` do not sum to ``expected[i]``; -1 when every row passes."""
    for i in range(addresses.shape[0]):
        if moved[i] < sizes[i] or _crc(0, addresses[i], sizes[i]) != expected[i]:
            return i
    return -1
