"""The object record of an NVMe extent file: the byte-level spec, its writer and its reader.

An NvmeTier object lives in one record: a 64-byte header, the payload right after it, and zero
padding up to the next multiple of ``RECORD_ALIGNMENT_BYTES`` (4 KiB) so every record starts and
ends on an O_DIRECT boundary. All integers are little-endian.

::

    offset  size  field
         0     4  magic                 b"TKOR" (tierkit object record)
         4     2  format_version        1
         6     2  reserved              0
         8     8  payload_size_bytes    u64
        16     8  version               u64, the catalog version of this put (unique per put)
        24     8  key_hash              u64, first 8 bytes of BLAKE2b(UTF-8 key, digest_size=8)
        32     4  payload_crc32         u32, zlib.crc32 of the payload bytes
        36    24  reserved              zeros
        60     4  header_crc32          u32, zlib.crc32 of header bytes [0, 60)
        64     n  payload
      64+n     p  zero padding, 0 <= p < 4096, so that 64 + n + p is a multiple of 4096

Checksum choice: CRC-32 (zlib's IEEE polynomial) runs at C speed, releases the GIL on large
buffers, and catches every burst error up to 32 bits and all but 2^-32 of random damage. It
guards against torn writes, bit rot and stale records, not against an adversary.

The reader trusts nothing in the record: it checks the magic, the header checksum, the format
version, and then that key hash, size, version and payload checksum all equal what the catalog
recorded for this key (so a stale record of the same key, or another key's record left in a
reused extent, is refused even though its own checksums hold). Padding is not checked.

Concurrency: pure functions over caller-owned buffers; safe from any thread.
Invariants: a record the writer produced passes the reader with the same expectations; any
change to bytes [0, 64 + n) makes the reader raise CorruptionError.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import NamedTuple

import numpy as np

from tiers.io.errors import CorruptionError, InvalidArgumentError

__all__ = [
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAGIC",
    "RECORD_ALIGNMENT_BYTES",
    "RecordHeader",
    "check_payload",
    "key_hash",
    "parse_header",
    "payload_crc32",
    "record_bytes",
    "write_record",
]

MAGIC = b"TKOR"
FORMAT_VERSION = 1
HEADER_BYTES = 64
RECORD_ALIGNMENT_BYTES = 4096
_HEADER = struct.Struct("<4sHHQQQI24x")  # bytes [0, 60); the header CRC follows at 60
_CRC = struct.Struct("<I")
assert _HEADER.size == 60 and _HEADER.size + _CRC.size == HEADER_BYTES


class RecordHeader(NamedTuple):
    """The fields of a validated header."""

    payload_size_bytes: int
    version: int
    key_hash: int
    payload_crc32: int


def key_hash(key: str) -> int:
    """The 64-bit key hash stored in a record header."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def record_bytes(payload_size_bytes: int) -> int:
    """Bytes a record of ``payload_size_bytes`` takes on disk (header + payload + padding)."""
    mask = RECORD_ALIGNMENT_BYTES - 1
    return (HEADER_BYTES + payload_size_bytes + mask) & ~mask


def payload_crc32(payload: np.ndarray | memoryview | bytes) -> int:
    return zlib.crc32(payload) & 0xFFFFFFFF


def write_record(record: np.ndarray, payload: np.ndarray, version: int, key_hash_: int) -> int:
    """Fill ``record`` (uint8, at least ``record_bytes(len(payload))`` long) with the record of
    ``payload``; returns the payload CRC.

    The CRC is taken over the copy inside ``record``, so what is checksummed is exactly what
    will be written even if the caller changes ``payload`` meanwhile.
    """
    size = payload.nbytes
    total = record_bytes(size)
    if record.nbytes < total:
        raise InvalidArgumentError(f"record buffer of {record.nbytes} bytes < {total}")
    body = record[HEADER_BYTES : HEADER_BYTES + size]
    body[:] = payload
    crc = payload_crc32(body)
    record[HEADER_BYTES + size : total] = 0  # padding: deterministic bytes, no stale data leak
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, 0, size, version, key_hash_, crc)
    record[: _HEADER.size] = np.frombuffer(header, np.uint8)
    record[_HEADER.size : HEADER_BYTES] = np.frombuffer(_CRC.pack(zlib.crc32(header)), np.uint8)
    return crc


def parse_header(record: np.ndarray, path: str, offset_bytes: int) -> RecordHeader:
    """Validate the 64-byte header at the start of ``record`` (format only, no expectations).

    Raises: CorruptionError naming ``path`` and ``offset_bytes`` (the record's file offset).
    """
    raw = record[:HEADER_BYTES].tobytes()
    if len(raw) < HEADER_BYTES:
        raise CorruptionError("record shorter than its header", path, offset_bytes)
    magic, fmt, _, size, version, khash, crc = _HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise CorruptionError(f"bad record magic {magic!r}", path, offset_bytes)
    (stored_crc,) = _CRC.unpack_from(raw, _HEADER.size)
    if zlib.crc32(raw[: _HEADER.size]) != stored_crc:
        raise CorruptionError("record header checksum mismatch", path, offset_bytes)
    if fmt != FORMAT_VERSION:
        raise CorruptionError(f"unknown record format version {fmt}", path, offset_bytes)
    return RecordHeader(size, version, khash, crc)


def check_payload(
    record: np.ndarray,
    path: str,
    offset_bytes: int,
    *,
    expect_key_hash: int,
    expect_size_bytes: int,
    expect_version: int,
    expect_crc32: int,
) -> np.ndarray:
    """Validate a whole record against what the catalog says it must be; returns the payload
    (a view into ``record``).

    Raises: CorruptionError naming ``path`` and ``offset_bytes`` on any mismatch.
    """
    header = parse_header(record, path, offset_bytes)
    expected = RecordHeader(expect_size_bytes, expect_version, expect_key_hash, expect_crc32)
    if header != expected:
        fields = [
            f"{name} {got} != {want}"
            for name, got, want in zip(RecordHeader._fields, header, expected, strict=True)
            if got != want
        ]
        raise CorruptionError(
            f"record does not match its catalog entry: {', '.join(fields)}", path, offset_bytes
        )
    if record.nbytes < HEADER_BYTES + header.payload_size_bytes:
        raise CorruptionError("record truncated", path, offset_bytes)
    payload = record[HEADER_BYTES : HEADER_BYTES + header.payload_size_bytes]
    if payload_crc32(payload) != header.payload_crc32:
        raise CorruptionError("payload checksum mismatch", path, offset_bytes)
    return payload
