"""The tierkit record file (``.tkr``): byte-level specification, shared by writer and reader.

A record file holds ``count`` samples (byte strings) addressable by index, either all of one size
(*fixed*: the offset of record ``i`` is arithmetic) or of any size (*variable*: an offset index).
All integers are little-endian.

::

    offset 0       header, HEADER_SIZE_BYTES = 64 bytes:
                     0  magic             8s   b"TKRECRD\\0"
                     8  version           u16  FORMAT_VERSION (1)
                    10  flags             u16  bit 0 FLAG_FIXED: every record is record_size_bytes
                    12  alignment_bytes   u32  records start at multiples of this (1 = packed)
                    16  count             u64  number of records
                    24  record_size_bytes u64  the size of every record (fixed), else 0
                    32  data_offset       u64  the first record's offset (a multiple of alignment)
                    40  index_offset      u64  where the index starts (after the last record)
                    48  index_size_bytes  u64  the index's length
                    56  header_crc        u32  CRC-32 of bytes 0..55
                    60  reserved          u32  zero
    data_offset    records; record i at offsets[i] (fixed: data_offset + i * stride, stride =
                   record_size_bytes rounded up to alignment_bytes); gaps are zero padding
    index_offset   the index:
                     variable only: offsets  i64[count]   file offset of each record
                     variable only: sizes    i64[count]   byte size of each record
                     both:          crcs     u32[count]   CRC-32 of each record's bytes
                     both:          index_crc u32         CRC-32 of the index bytes before it

A writer puts a zero header first and the real one last (after the index and an fsync), so a file
whose writer never finished has a bad magic and is refused rather than read as empty.

Checksums are verified on request (``verify=True``): zlib's CRC-32 costs ~10 us per 32 KiB here,
as much as the whole rest of the loader's per-sample work, so it is not on by default.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

from dataload.errors import SourceFormatError

__all__ = [
    "FLAG_FIXED",
    "FORMAT_VERSION",
    "HEADER_SIZE_BYTES",
    "MAGIC",
    "RecordHeader",
    "index_size_bytes",
    "parse_index",
]

MAGIC = b"TKRECRD\0"
FORMAT_VERSION = 1
FLAG_FIXED = 1
HEADER_SIZE_BYTES = 64
_HEADER = struct.Struct("<8sHHIQQQQQ")  # everything before header_crc (56 bytes)
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class RecordHeader:
    """The decoded 64-byte header."""

    flags: int
    alignment_bytes: int
    count: int
    record_size_bytes: int
    data_offset: int
    index_offset: int
    index_size_bytes: int

    @property
    def fixed(self) -> bool:
        return bool(self.flags & FLAG_FIXED)

    @property
    def stride_bytes(self) -> int:
        """Distance between consecutive fixed-size records."""
        align = self.alignment_bytes
        return -(-self.record_size_bytes // align) * align

    def pack(self) -> bytes:
        body = _HEADER.pack(
            MAGIC,
            FORMAT_VERSION,
            self.flags,
            self.alignment_bytes,
            self.count,
            self.record_size_bytes,
            self.data_offset,
            self.index_offset,
            self.index_size_bytes,
        )
        return body + _CRC.pack(zlib.crc32(body)) + bytes(4)

    @classmethod
    def unpack(cls, raw: bytes, source: str, file_size_bytes: int) -> RecordHeader:
        """Decode and check a header; raises SourceFormatError saying what is wrong."""
        if len(raw) < HEADER_SIZE_BYTES:
            raise SourceFormatError(source, f"{len(raw)} bytes, too short for a record file")
        magic, version, flags, align, count, size, data, index, index_size = _HEADER.unpack_from(
            raw
        )
        if magic != MAGIC:
            raise SourceFormatError(source, "not a tierkit record file (or never closed)")
        if version != FORMAT_VERSION:
            raise SourceFormatError(source, f"format version {version}, expected {FORMAT_VERSION}")
        if _CRC.unpack_from(raw, _HEADER.size)[0] != zlib.crc32(raw[: _HEADER.size]):
            raise SourceFormatError(source, "header checksum mismatch")
        header = cls(flags, align, count, size, data, index, index_size)
        if align <= 0 or data % align or index < data:
            raise SourceFormatError(source, "inconsistent header offsets")
        if index + index_size > file_size_bytes:
            raise SourceFormatError(
                source,
                f"truncated: the index ends at byte {index + index_size}, "
                f"the file has {file_size_bytes}",
            )
        if index_size != index_size_bytes(count, header.fixed):
            raise SourceFormatError(source, f"index of {index_size} bytes for {count} records")
        return header


def index_size_bytes(count: int, fixed: bool) -> int:
    """Bytes of the index for ``count`` records."""
    return count * (4 if fixed else 20) + 4


def parse_index(
    raw: bytes, header: RecordHeader, source: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets i64, sizes i64, crcs u32) of every record; fixed files get computed offsets."""
    count = header.count
    if _CRC.unpack_from(raw, len(raw) - 4)[0] != zlib.crc32(raw[:-4]):
        raise SourceFormatError(source, "index checksum mismatch")
    if header.fixed:
        offsets = header.data_offset + np.arange(count, dtype=np.int64) * header.stride_bytes
        sizes = np.full(count, header.record_size_bytes, np.int64)
        crcs = np.frombuffer(raw, np.uint32, count, 0)
    else:
        offsets = np.frombuffer(raw, "<i8", count, 0).astype(np.int64)
        sizes = np.frombuffer(raw, "<i8", count, 8 * count).astype(np.int64)
        crcs = np.frombuffer(raw, "<u4", count, 16 * count)
    if count and (
        offsets.min() < header.data_offset
        or (offsets + sizes).max() > header.index_offset
        or sizes.min() < 0
    ):
        raise SourceFormatError(source, "a record lies outside the data region")
    return offsets, sizes, crcs
