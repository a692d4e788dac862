"""Write-ahead log: every insert and delete is durable here before it is acknowledged.

Segments ``wal-<seq:08d>.log`` in the index directory; a checkpoint starts a new segment and,
once its LMDB commit is durable, deletes the older ones. On open, the segments at or after the
checkpoint's are replayed in order; a torn record at the end of the last segment (a crash in
mid-append) ends the log and is cut off. Record layout (little-endian)::

    offset  size  field
    0       4     magic     0x31574B54 ("TKW1")
    4       1     kind      1 = insert, 2 = delete
    5       3     reserved  0
    8       8     lsn       uint64, +1 per record across segments
    16      4     count     number of ids
    20      4     payload   bytes that follow the header
    24      4     crc32     of bytes 0..23 and the payload
    28      4     reserved  0
    32      ...   payload   ids int64[count]; for inserts then vectors [count, dim] in the index
                            dtype; zero-padded to a multiple of 8 bytes

Concurrency: loop thread; appends are serialised (write + fdatasync under one lock), so the
order of records is the order of acknowledgement.
"""

from __future__ import annotations

import asyncio
import os
import re
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiers.engine import FileHandle, IOEngine
from tiers.errors import map_os_errors
from tiers.tier_directory import fsync_directory

__all__ = ["DELETE", "INSERT", "WalRecord", "WriteAheadLog", "read_segment", "segment_name"]

INSERT, DELETE = 1, 2
_MAGIC = 0x31574B54
_HEADER = np.dtype(
    [("magic", "<u4"), ("kind", "u1"), ("r0", "u1", 3), ("lsn", "<u8"), ("count", "<u4"),
     ("payload", "<u4"), ("crc", "<u4"), ("r1", "<u4")]
)  # fmt: skip
_SEGMENT = re.compile(r"^wal-(\d{8})\.log$")


def segment_name(seq: int) -> str:
    return f"wal-{seq:08d}.log"


@dataclass
class WalRecord:
    kind: int
    lsn: int
    ids: np.ndarray
    vectors: np.ndarray | None


def encode_record(kind: int, lsn: int, ids: np.ndarray, vectors: np.ndarray | None) -> bytes:
    payload = np.ascontiguousarray(ids, np.int64).tobytes()
    if vectors is not None:
        payload += np.ascontiguousarray(vectors).tobytes()
    payload += b"\0" * (-len(payload) % 8)
    header = np.zeros(1, _HEADER)
    header["magic"], header["kind"], header["lsn"] = _MAGIC, kind, lsn
    header["count"], header["payload"] = len(ids), len(payload)
    head = header.tobytes()
    header["crc"] = zlib.crc32(payload, zlib.crc32(head[:24]))
    return header.tobytes() + payload


def read_segment(path: str, dim: int, dtype: Any) -> tuple[list[WalRecord], int]:
    """Records of one segment and the byte length of its valid prefix."""
    with map_os_errors(path), open(path, "rb") as f:
        data = f.read()
    records, offset = [], 0
    while offset + _HEADER.itemsize <= len(data):
        header = np.frombuffer(data, _HEADER, 1, offset)[0]
        end = offset + _HEADER.itemsize + int(header["payload"])
        if header["magic"] != _MAGIC or end > len(data) or header["kind"] not in (INSERT, DELETE):
            break
        payload = data[offset + _HEADER.itemsize : end]
        if zlib.crc32(payload, zlib.crc32(data[offset : offset + 24])) != header["crc"]:
            break
        count = int(header["count"])
        ids = np.frombuffer(payload, np.int64, count).copy()
        vectors = None
        if header["kind"] == INSERT:
            vectors = np.frombuffer(payload, dtype, count * dim, count * 8).reshape(count, dim)
        records.append(WalRecord(int(header["kind"]), int(header["lsn"]), ids, vectors.copy()
                                 if vectors is not None else None))  # fmt: skip
        offset = end
    return records, offset


def list_segments(directory: str) -> list[int]:
    with map_os_errors(directory):
        names = os.listdir(directory)
    return sorted(int(m.group(1)) for n in names if (m := _SEGMENT.match(n)))


class WriteAheadLog:
    """The open tail segment; ``append`` returns once the record is on stable storage."""

    def __init__(self, engine: IOEngine, directory: str) -> None:
        self.engine = engine
        self.directory = directory
        self.seq = -1
        self.next_lsn = 1
        self.bytes_written = 0  # in the current segment
        self._file: FileHandle | None = None
        self._lock = asyncio.Lock()

    async def start_segment(self, seq: int, valid_bytes: int = 0) -> None:
        """Append to segment ``seq`` from ``valid_bytes`` (a torn tail beyond is cut off)."""
        path = os.path.join(self.directory, segment_name(seq))
        file = await self.engine.open(path, write=True, create=True)
        with map_os_errors(path):
            os.truncate(path, valid_bytes)
        await self.engine.fsync(file)
        await asyncio.to_thread(fsync_directory, self.engine.env, self.directory)
        old, self._file, self.seq, self.bytes_written = self._file, file, seq, valid_bytes
        if old is not None:
            await self.engine.close_file(old)

    async def append(self, kind: int, ids: np.ndarray, vectors: np.ndarray | None) -> int:
        async with self._lock:
            assert self._file is not None
            lsn = self.next_lsn
            record = encode_record(kind, lsn, ids, vectors)
            await self.engine.write_from(self._file, self.bytes_written, record)
            await self.engine.fsync(self._file, datasync=True)
            self.next_lsn += 1
            self.bytes_written += len(record)
            return lsn

    def drop_segments_before(self, seq: int) -> None:
        for old in list_segments(self.directory):
            if old < seq:
                with map_os_errors(self.directory):
                    os.unlink(os.path.join(self.directory, segment_name(old)))

    async def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            await self.engine.close_file(file)
