"""The tar shard index and its sidecar file: the byte-level format, a writer and a reader.

A :class:`ShardIndex` says, for one tar shard, which members form each sample and where each
member's data lies, plus the shard's size and mtime when it was indexed. It is stored next to the
shard (or in a cache directory) as a sidecar, all integers little-endian::

    offset  size      field
    0       8         magic b"TKTARIX\\0"
    8       4         u32 format version (1)
    12      4         u32 F: number of distinct field names (extensions)
    16      8         u64 shard size in bytes when indexed (st_size)
    24      8         i64 shard mtime in nanoseconds when indexed (st_mtime_ns)
    32      8         u64 S: number of samples
    40      8         u64 M: number of members (regular files that belong to a sample)
    48      8         u64 B: size of the string blob in bytes
    56      4         u32 CRC-32 of every byte from offset 64 to the end
    60      4         u32 reserved, 0
    64      8(S+1)    u64 first member of each sample; entry S is M (sample s owns
                          members first[s] .. first[s+1]-1, consecutive in the archive)
    ..      8M        u64 offset of each member's data in the shard
    ..      8M        u64 size of each member's data in bytes
    ..      4M        u32 field of each member (an index into the field names)
    ..      8S        u64 end of each sample's key in the blob (keys back to back from 0)
    ..      8F        u64 end of each field name in the blob (after the last key)
    ..      B         the blob: UTF-8 keys, then UTF-8 field names

The file is exactly ``64 + 8(S+1) + 20M + 8S + 8F + B`` bytes. :func:`read_sidecar` returns
None for anything that does not check out -- missing, wrong magic or version, wrong length, bad
CRC -- and the caller re-indexes: a sidecar is a cache, never trusted over the shard. Whether it
is *fresh* (size and mtime still those of the shard) is the caller's check.

Concurrency: :func:`write_sidecar` writes a temporary file and renames it over the target, so
concurrent writers (ranks indexing the same shard) and readers never see a partial sidecar.
"""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass

import numpy as np

__all__ = ["SIDECAR_SUFFIX", "ShardIndex", "read_sidecar", "write_sidecar"]

MAGIC = b"TKTARIX\0"
VERSION = 1
SIDECAR_SUFFIX = ".tkidx"
_HEADER = struct.Struct("<8sIIQqQQQII")
assert _HEADER.size == 64


@dataclass(frozen=True)
class ShardIndex:
    """One shard's samples: member ranges per sample, member data locations, keys, fields."""

    shard_size_bytes: int
    shard_mtime_ns: int
    first_member: np.ndarray  # int64 [S + 1]
    member_offset: np.ndarray  # int64 [M]
    member_size: np.ndarray  # int64 [M]
    member_field: np.ndarray  # int32 [M]
    keys: list[str]
    fields: list[str]

    @property
    def sample_count(self) -> int:
        return len(self.keys)

    def fresh_for(self, stat: os.stat_result) -> bool:
        """Whether the shard is still the file this index was built from."""
        return (stat.st_size, stat.st_mtime_ns) == (self.shard_size_bytes, self.shard_mtime_ns)


def _blob(index: ShardIndex) -> tuple[bytes, np.ndarray, np.ndarray]:
    keys = [k.encode("utf-8", "surrogateescape") for k in index.keys]
    fields = [f.encode("utf-8", "surrogateescape") for f in index.fields]
    ends = np.cumsum([len(b) for b in keys + fields], dtype=np.int64)
    return b"".join(keys + fields), ends[: len(keys)], ends[len(keys) :]


def encode_sidecar(index: ShardIndex) -> bytes:
    """The sidecar bytes of ``index`` (the layout in the module doc)."""
    blob, key_ends, field_ends = _blob(index)
    body = b"".join(
        (
            index.first_member.astype("<u8").tobytes(),
            index.member_offset.astype("<u8").tobytes(),
            index.member_size.astype("<u8").tobytes(),
            index.member_field.astype("<u4").tobytes(),
            key_ends.astype("<u8").tobytes(),
            field_ends.astype("<u8").tobytes(),
            blob,
        )
    )
    header = _HEADER.pack(
        MAGIC,
        VERSION,
        len(index.fields),
        index.shard_size_bytes,
        index.shard_mtime_ns,
        index.sample_count,
        len(index.member_offset),
        len(blob),
        zlib.crc32(body),
        0,
    )
    return header + body


def write_sidecar(path: str, index: ShardIndex) -> None:
    """Write ``index`` to ``path`` atomically (temporary file in the same folder, then rename).

    Raises OSError when the folder is not writable (the caller then tries its cache folder).
    """
    folder = os.path.dirname(path) or "."
    fd, temp = tempfile.mkstemp(prefix=".tkidx-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(encode_sidecar(index))
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def read_sidecar(path: str) -> ShardIndex | None:
    """The index in the sidecar at ``path``, or None if it is absent or does not check out."""
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except OSError:
        return None
    return decode_sidecar(raw)


def decode_sidecar(raw: bytes) -> ShardIndex | None:
    if len(raw) < _HEADER.size:
        return None
    magic, version, n_fields, size, mtime_ns, n_samples, n_members, n_blob, crc, _ = (
        _HEADER.unpack_from(raw)
    )
    expected = _HEADER.size + 8 * (n_samples + 1) + 20 * n_members + 8 * n_samples
    expected += 8 * n_fields + n_blob
    if magic != MAGIC or version != VERSION or len(raw) != expected:
        return None
    if zlib.crc32(memoryview(raw)[_HEADER.size :]) != crc:
        return None
    at = _HEADER.size

    def take(dtype: str, count: int) -> np.ndarray:
        nonlocal at
        array = np.frombuffer(raw, dtype, count, at)
        at += array.nbytes
        return array

    first = take("<u8", n_samples + 1).astype(np.int64)
    offsets = take("<u8", n_members).astype(np.int64)
    sizes = take("<u8", n_members).astype(np.int64)
    fields_of = take("<u4", n_members).astype(np.int32)
    ends = np.concatenate(([0], take("<u8", n_samples + n_fields))).astype(np.int64).tolist()
    blob = raw[at:]
    names = [
        blob[ends[i] : ends[i + 1]].decode("utf-8", "surrogateescape")
        for i in range(n_samples + n_fields)
    ]
    if (
        first[0] != 0
        or first[-1] != n_members
        or (np.diff(first) <= 0).any()
        or (fields_of >= n_fields).any()
    ):
        return None
    return ShardIndex(
        size, mtime_ns, first, offsets, sizes, fields_of, names[:n_samples], names[n_samples:]
    )
