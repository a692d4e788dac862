"""Sealed LMDB records and the structural check of LMDB data files.

A *sealed* value is its body followed by ``zlib.crc32(key + body)`` as a little-endian u32, so a
flipped byte in a key or a value fails the check of its record: a damaged key can neither pass
for another key nor vanish unnoticed. The NVMe tier's catalog (tiers.nvme.catalog) and the vector
index's checkpoint store (vectordb.meta) seal every record and count them.

:func:`check_lmdb_file` walks a data file with py-lmdb's pure-Python verifier (``lmdb.verify``,
py-lmdb >= 3.0) before LMDB maps it: LMDB 0.9 checksums nothing and trusts its page headers, so
damage there could make it read outside the file and kill the process (SIGBUS). Opening,
growing and writing environments, and LMDB's errors, are tiers.storage.lmdb_env's.

Thread-safety: pure functions; safe from any thread.
"""

from __future__ import annotations

import os
import struct
import zlib

from lmdb.verify import VerifyError, verify  # py-lmdb >= 3.0 (pinned): pure Python, uncrashable

from tiers.io.errors import CorruptionError, map_os_errors

__all__ = ["check_lmdb_file", "seal", "unseal"]

_U32 = struct.Struct("<I")


def seal(key: bytes, body: bytes) -> bytes:
    """The value to store under ``key``: ``body``, then the CRC-32 of ``key + body``."""
    return body + _U32.pack(zlib.crc32(body, zlib.crc32(key)))


def unseal(key: bytes, value: bytes, path: str) -> bytes:
    """The body of a sealed value; CorruptionError naming ``path`` if its key or value changed."""
    body = value[: -_U32.size]
    crc = zlib.crc32(body, zlib.crc32(key))
    if len(value) < _U32.size or _U32.unpack_from(value, len(body))[0] != crc:
        raise CorruptionError(f"LMDB record {key[:64]!r} fails its checksum in {path}", path)
    return body


def check_lmdb_file(data_path: str) -> None:
    """CorruptionError if ``data_path`` fails LMDB's structural check; run before LMDB maps it.

    LMDB 0.9 trusts its pages: a damaged page header can make it read outside the file, and the
    process dies of SIGBUS. An absent or empty file (a new environment) passes.
    """
    with map_os_errors(data_path):
        fresh = not os.path.isfile(data_path) or os.path.getsize(data_path) == 0
        try:
            problems = [] if fresh else verify(data_path, subdir=False)
        except VerifyError as exc:
            problems = [str(exc)]
    if problems:
        found = "; ".join(problems[:3])
        raise CorruptionError(f"{data_path} fails LMDB's structural check: {found}", data_path)
