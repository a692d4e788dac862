"""Chunked records: a CRC-32 per chunk in the catalog entry, so a byte range is read and checked
alone (the layout is specified in tiers.nvme.format, "Chunked record" and "Chunk extension").

A put of ``CHUNKED_FROM_BYTES`` or more is written as a chunked record: the payload from the
record's first byte, zero padding to a page, no header; its catalog entry carries the chunk
extension (format, chunk size, one CRC-32 per chunk). A get of a byte range reads the *window*
of whole chunks that covers the range (page-aligned: a chunk is a power of two >= 256 KiB, and
the last one ends where the record's padding ends), checks exactly those chunks, and copies the
asked bytes out; a whole get is the window of every chunk. Damage in chunks outside a range is
not seen by that range's get, and is seen by any get (or scrub) whose window holds it.

Why 256 KiB (measured, RESULTS.md "per-range checksums"): a window is one request whatever its
chunk count, and summing 256 x 256 KiB with ``crc32_many`` costs what one CRC-32 over the
64 MiB costs; smaller chunks cost catalog bytes (4 B a chunk, ~8 B a chunk with LMDB's pages),
larger ones read more than asked for a range that does not start or end on a chunk boundary.
Tables are capped at ``MAX_CHUNKS`` entries (a record above 256 MiB gets larger chunks), so an
entry stays under 4.2 KiB.

Concurrency: pure functions over caller-owned buffers; safe from any thread.
Invariants: a window is page-aligned in the record and lies inside it; ``check_window`` returns
only if every chunk of the window matches its CRC-32 in the entry.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from tiers.io.errors import CorruptionError
from tiers.nvme.checksums import crc32_many
from tiers.nvme.format import (
    CHUNK_EXTENSION_FORMAT,
    CHUNK_LOG2,
    CHUNKED_FROM_BYTES,
    MAX_CHUNK_LOG2,
    MAX_CHUNKS,
    RECORD_ALIGNMENT_BYTES,
)

__all__ = [
    "catalog_entry_bytes",
    "check_window",
    "chunk_count",
    "chunk_log2_for",
    "chunk_rows",
    "chunk_sizes",
    "extension_problem",
    "pack_chunks",
    "sum_chunks",
    "table_crc",
    "table_of",
    "window",
]

_EXTENSION = struct.Struct("<HBB")  # extension format, chunk_log2, reserved
_PAGE_MASK = RECORD_ALIGNMENT_BYTES - 1


def chunk_log2_for(size_bytes: int) -> int:
    """log2 of the chunk size a put of ``size_bytes`` is written with; 0: not chunked."""
    if size_bytes < CHUNKED_FROM_BYTES:
        return 0
    per_chunk = -(-size_bytes // MAX_CHUNKS)
    return max(CHUNK_LOG2, (per_chunk - 1).bit_length())


def catalog_entry_bytes(size_bytes: int) -> int:
    """Bytes of the catalog value (sealed) of a put of ``size_bytes``: 36, and 4 + 4 per
    chunk for a chunked record (LMDB's pages and keys come on top: ~2 x with a 150-byte key)."""
    log2 = chunk_log2_for(size_bytes)
    return 36 + (_EXTENSION.size + 4 * chunk_count(size_bytes, log2) if log2 else 0)


def chunk_count(size_bytes: int, log2: int) -> int:
    return (size_bytes + (1 << log2) - 1) >> log2


def pack_chunks(log2: int, crcs: np.ndarray) -> bytes:
    """The chunk extension of an entry (its bytes after the 32 of the base entry)."""
    return _EXTENSION.pack(CHUNK_EXTENSION_FORMAT, log2, 0) + crcs.astype("<u4").tobytes()


def table_of(chunks: bytes) -> tuple[int, np.ndarray]:
    """(chunk_log2, the CRC-32 of each chunk as uint32) of a checked extension."""
    return chunks[2], np.frombuffer(chunks, "<u4", offset=_EXTENSION.size)


def table_crc(chunks: bytes) -> int:
    """What a chunked entry holds in its ``crc32`` field: the CRC-32 of its CRC table."""
    return zlib.crc32(memoryview(chunks)[_EXTENSION.size :]) & 0xFFFFFFFF


def extension_problem(chunks: bytes, size_bytes: int, crc32: int) -> str | None:
    """What is wrong with an entry's chunk extension, or None (catalog load checks)."""
    if len(chunks) < _EXTENSION.size:
        return f"a chunk extension of {len(chunks)} bytes"
    fmt, log2, reserved = _EXTENSION.unpack_from(chunks)
    if fmt != CHUNK_EXTENSION_FORMAT or reserved:
        return f"unknown chunk extension format {fmt} ({reserved})"
    if not CHUNK_LOG2 <= log2 <= MAX_CHUNK_LOG2:
        return f"a chunk of 2**{log2} bytes"
    want = _EXTENSION.size + 4 * chunk_count(size_bytes, log2)
    if len(chunks) != want or size_bytes <= 0:
        return f"{len(chunks)} extension bytes for {size_bytes} bytes in 2**{log2} chunks"
    if table_crc(chunks) != crc32:
        return "the chunk table does not match the entry's crc32"
    return None


def window(size_bytes: int, log2: int, offset: int, nbytes: int) -> tuple[int, int, int]:
    """(first chunk, start, bytes) of the record bytes to read for payload bytes
    ``[offset, offset + nbytes)``; an empty range reads the chunk it points into."""
    last_chunk = chunk_count(size_bytes, log2) - 1
    first = min(offset >> log2, last_chunk)
    last = first if nbytes == 0 else (offset + nbytes - 1) >> log2
    start = first << log2
    end = min((last + 1) << log2, (size_bytes + _PAGE_MASK) & ~_PAGE_MASK)
    return first, start, end - start


def chunk_sizes(size_bytes: int, log2: int, first: int, window_bytes: int) -> np.ndarray:
    """The payload bytes of each chunk of a window (int64): all whole but maybe the last."""
    count = chunk_count(min(window_bytes, size_bytes - (first << log2)), log2)
    sizes = np.full(count, 1 << log2, np.int64)
    sizes[-1] = min(1 << log2, size_bytes - ((first + count - 1) << log2))
    return sizes


def chunk_rows(
    size_bytes: int, chunks: bytes, first: int, window_bytes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets in the window, sizes, expected CRC-32s) of a window's chunks, as int64."""
    log2, table = table_of(chunks)
    sizes = chunk_sizes(size_bytes, log2, first, window_bytes)
    offsets = np.arange(len(sizes), dtype=np.int64) << log2
    return offsets, sizes, table[first : first + len(sizes)].astype(np.int64)


def _crcs(region: np.ndarray, offsets: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """CRC-32 of ``region[offsets[i] : offsets[i] + sizes[i]]`` for every i (int64)."""
    crcs = crc32_many(offsets + region.ctypes.data, sizes) if region.nbytes else None
    if crcs is not None:
        return crcs
    pairs = zip(offsets.tolist(), sizes.tolist(), strict=True)
    return np.array([zlib.crc32(region[o : o + n].data) for o, n in pairs], np.int64)


def sum_chunks(payload: np.ndarray, log2: int) -> np.ndarray:
    """The CRC-32 of each chunk of ``payload`` (a contiguous uint8 array), as int64."""
    sizes = chunk_sizes(payload.nbytes, log2, 0, payload.nbytes)
    offsets = np.arange(len(sizes), dtype=np.int64) << log2
    return _crcs(payload, offsets, sizes)


def check_window(
    region: np.ndarray,
    size_bytes: int,
    chunks: bytes,
    first: int,
    path: str,
    offset_bytes: int,
) -> None:
    """Check the chunks of a window read into ``region`` (the window's bytes, from chunk
    ``first``) against the entry's table.

    Raises: CorruptionError naming ``path`` and ``offset_bytes`` (the record's) and the first
    chunk that fails.
    """
    offsets, sizes, expected = chunk_rows(size_bytes, chunks, first, region.nbytes)
    bad = np.flatnonzero(_crcs(region, offsets, sizes) != expected)
    if len(bad):
        index = first + int(bad[0])
        log2 = chunks[2]
        raise CorruptionError(
            f"chunk {index} checksum mismatch (chunked record, payload bytes "
            f"[{index << log2}, {(index << log2) + int(sizes[bad[0]])}))",
            path,
            offset_bytes,
        )
