"""The object records of an NVMe extent file: the byte-level spec, its writers and its readers.

An NvmeTier object lives in one record that starts on a 4 KiB boundary and whose length is a
multiple of ``RECORD_ALIGNMENT_BYTES`` (4 KiB), so every record moves with O_DIRECT. There are
three kinds; which one an object has follows from its catalog entry and the tier's format marker
(below), never from the bytes on disk: an entry with a chunk extension is a chunked record;
otherwise the marker decides between bare and header. All integers are little-endian.

**Header record** (every object of a format-1 tier; in format 2, objects whose size is not a
positive multiple of 4 KiB, whose padding has room for a header anyway): a 64-byte header, the
payload right after it, and zero padding up to the next 4 KiB boundary.

::

    offset  size  field
         0     4  magic                 b"TKOR" (tierkit object record)
         4     2  format_version        1 (the header layout)
         6     2  reserved              0
         8     8  payload_size_bytes    u64
        16     8  version               u64, the catalog version of this put (unique per put)
        24     8  key_hash              u64, first 8 bytes of BLAKE2b(UTF-8 key, digest_size=8)
        32     4  payload_crc32         u32, zlib.crc32 of the payload bytes
        36    24  reserved              zeros
        60     4  header_crc32          u32, zlib.crc32 of header bytes [0, 60)
        64     n  payload
      64+n     p  zero padding, 0 <= p < 4096, so that 64 + n + p is a multiple of 4096

Writer: :func:`write_record`; reader: :func:`check_payload`.

**Bare record** (format 2, an object of n = k x 4096 bytes, k >= 1): the n payload bytes and
nothing else, so a 4 KiB object takes 4 KiB on disk, not 8 KiB. Its header would hold nothing
the catalog entry does not (size, version, payload CRC-32; the entry is keyed by the key, which
is what the key hash checks), so the entry is its header. Writer: :func:`write_bare` (copies the
payload, returns its CRC-32 for the entry); reader: :func:`check_bare` (length and CRC-32 against
the entry).

**Chunked record** (every put of n >= ``CHUNKED_FROM_BYTES`` = 1 MiB since the chunk
extension; any tier format): the n payload bytes from the record's first byte, then zero padding
up to the next 4 KiB boundary (0 <= p < 4096); no header. Its catalog entry carries a *chunk
extension*, so a byte range is read and checked alone (tiers.nvme.chunks). With C =
2**chunk_log2, chunk i is payload bytes [i x C, min((i + 1) x C, n)), i < ceil(n / C); C is
``2**CHUNK_LOG2`` = 256 KiB, or the smallest power of two that keeps ceil(n / C) <=
``MAX_CHUNKS`` = 1024. A range [a, a + m) is served by reading record bytes [floor(a / C) x C,
min((floor((a + m - 1) / C) + 1) x C, n + p)) (page-aligned: C is a multiple of 4 KiB) and
checking the CRC-32 of each of those chunks; an empty range reads the chunk at a.

**Chunk extension** (the catalog value's bytes after the 32-byte base entry, tiers.nvme.catalog;
a base entry alone, 32 bytes, is a bare or header record as before)::

    offset  size  field
         0     2  extension_format      u16, 1
         2     1  chunk_log2            u8, 18..30
         3     1  reserved              0
         4   4 k  chunk_crc32[k]        u32 each, zlib.crc32 of chunk i, k = ceil(n / C)

and the base entry's ``crc32`` field holds zlib.crc32 of the k x 4 table bytes (a chunked record
has no whole-payload CRC: a whole get checks all k chunks). A reader that predates the extension
refuses such an entry (a catalog value of the wrong length: CorruptionError), never misreads it.

**Tier format marker**: ``<tier dir>/FORMAT``, 32 bytes, written once (to a temporary file,
fsynced, renamed, directory fsynced) when a tier is created or a format-1 tier is first opened
by a format-2 writer, before any put::

    offset  size  field
         0     4  magic                 b"TKNF"
         4     4  tier_format           u32, 2
         8     8  bare_from_version     u64: an entry of version >= this whose size is a
                                        positive multiple of 4 KiB is a bare record; every other
                                        entry is a header record (but chunked ones)
        16    12  reserved              zeros
        28     4  marker_crc32          u32, zlib.crc32 of bytes [0, 28)

A directory without the file is format 1; the first open writes the marker with
``bare_from_version`` = the catalog's next version, so every record written before stays a
header record and is read as one. A damaged marker is a CorruptionError, never a guess.
Writer: ``tiers.nvme.marker.pack_marker``; reader: ``tiers.nvme.marker.parse_marker``.

Checksum choice: CRC-32 (zlib's IEEE polynomial) runs at C speed, releases the GIL on large
buffers, and catches every burst error up to 32 bits and all but 2^-32 of random damage. It
guards against torn writes, bit rot and stale records, not against an adversary. Payloads of
16 KiB and more are summed by libdeflate's CRC-32 where it is installed (tiers.nvme.checksums).

The readers trust nothing on disk. A header record: magic, header checksum, format version,
then key hash, size, version and payload checksum must all equal what the catalog recorded for
this key (a stale record of the same key, or another key's record left in a reused extent, is
refused even though its own checksums hold). A bare record: its CRC-32 must equal the entry's; a
chunked record: the CRC-32 of each chunk read must equal the entry's; a stale or foreign record
in the extent passes only if it holds exactly the entry's bytes (up to CRC-32's 2^-32), which
are then the right bytes. Padding is not checked.

Concurrency: pure functions over caller-owned buffers; safe from any thread.
Invariants: a record either writer produced passes its reader with the same expectations; any
change to bytes [0, 64 + n) of a header record or [0, n) of a bare one makes the reader raise
CorruptionError; so does any change to a chunk of a chunked record that a read's window holds.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import NamedTuple

import numpy as np

from tiers.io.errors import CorruptionError, InvalidArgumentError
from tiers.nvme.checksums import payload_crc32

__all__ = [
    "CHUNKED_FROM_BYTES",
    "CHUNK_EXTENSION_FORMAT",
    "CHUNK_LOG2",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_CHUNKS",
    "MAX_CHUNK_LOG2",
    "RECORD_ALIGNMENT_BYTES",
    "RecordHeader",
    "check_bare",
    "check_payload",
    "is_bare",
    "key_hash",
    "parse_header",
    "payload_crc32",
    "record_bytes",
    "stored_bytes",
    "write_bare",
    "write_record",
]

MAGIC = b"TKOR"
FORMAT_VERSION = 1
HEADER_BYTES = 64
RECORD_ALIGNMENT_BYTES = 4096
_HEADER = struct.Struct("<4sHHQQQI24x")  # bytes [0, 60); the header CRC follows at 60
_CRC = struct.Struct("<I")
assert _HEADER.size == 60 and _HEADER.size + _CRC.size == HEADER_BYTES
CHUNKED_FROM_BYTES = 1 << 20  # puts of this size and more are chunked records
CHUNK_EXTENSION_FORMAT = 1
CHUNK_LOG2 = 18  # 256 KiB chunks (tiers.nvme.chunks says why)
MAX_CHUNK_LOG2 = 30
MAX_CHUNKS = 1024  # larger records get larger chunks: an entry stays under 4.2 KiB


class RecordHeader(NamedTuple):
    """The fields of a validated header."""

    payload_size_bytes: int
    version: int
    key_hash: int
    payload_crc32: int


def key_hash(key: str) -> int:
    """The 64-bit key hash stored in a record header."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def is_bare(payload_size_bytes: int) -> bool:
    """Whether the format-2 writer stores a payload of this size as a bare record."""
    return payload_size_bytes > 0 and payload_size_bytes % RECORD_ALIGNMENT_BYTES == 0


def record_bytes(payload_size_bytes: int, bare: bool = False, chunked: bool = False) -> int:
    """Bytes a record of ``payload_size_bytes`` takes on disk: a header record (header +
    payload + padding), with ``bare`` the payload alone, with ``chunked`` payload + padding."""
    if bare:
        return payload_size_bytes
    mask = RECORD_ALIGNMENT_BYTES - 1
    if chunked:
        return (payload_size_bytes + mask) & ~mask
    return (HEADER_BYTES + payload_size_bytes + mask) & ~mask


def stored_bytes(payload_size_bytes: int) -> int:
    """Bytes a put of ``payload_size_bytes`` takes on disk (this writer, any tier format)."""
    if payload_size_bytes >= CHUNKED_FROM_BYTES:
        return record_bytes(payload_size_bytes, chunked=True)
    return record_bytes(payload_size_bytes, is_bare(payload_size_bytes))


def write_bare(record: np.ndarray, payload: np.ndarray) -> int:
    """Copy ``payload`` (a positive multiple of 4 KiB) into ``record``; returns its CRC-32,
    taken over the copy (what will be written), for the catalog entry."""
    size = payload.nbytes
    if not is_bare(size) or record.nbytes < size:
        raise InvalidArgumentError(
            f"a bare record of {size} bytes in a {record.nbytes}-byte buffer"
        )
    body = record[:size]
    body[:] = payload
    return payload_crc32(body)


def check_bare(
    record: np.ndarray, path: str, offset_bytes: int, *, expect_size_bytes: int, expect_crc32: int
) -> np.ndarray:
    """Validate a bare record against its catalog entry; returns the payload (a view).

    Raises: CorruptionError naming ``path`` and ``offset_bytes`` (truncated, or a checksum that
    is not the entry's: damaged, torn, or not this entry's record).
    """
    if record.nbytes < expect_size_bytes:
        raise CorruptionError("record truncated", path, offset_bytes)
    payload = record[:expect_size_bytes]
    if payload_crc32(payload) != expect_crc32:
        raise CorruptionError("payload checksum mismatch (bare record)", path, offset_bytes)
    return payload


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
