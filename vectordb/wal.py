"""Write-ahead log: every insert and delete is durable here before it is acknowledged.

Segments ``wal-<seq:08d>.log`` in the index directory; a checkpoint starts a new segment and,
once its LMDB commit is durable, deletes the older ones. On open, the segments at or after the
checkpoint's are replayed in order.

Torn tail versus damage: appends are serialised and each is fdatasynced before it is
acknowledged, so a crash can tear only the last record of the newest segment (and starting a
new segment first cuts the old one to its last acknowledged record). A record that fails its
check therefore ends the log as a torn tail, cut off on reopen, exactly when it is in the newest
segment and no whole record follows it. A failed record with a whole record after it, or at the
end of an older segment, is damage to acknowledged updates: CorruptionError naming the file and
offset, never a silent cut. (So a flipped byte in the very last record reads as a torn append;
nothing in the bytes tells the two apart.)

Record layout (little-endian)::

    offset  size  field
    0       4     magic     0x31574B54 ("TKW1")
    4       1     kind      1 = insert, 2 = delete
    5       3     reserved  0
    8       8     lsn       uint64, +1 per record across segments
    16      4     count     number of ids
    20      4     payload   bytes that follow the header
    24      4     crc32     of bytes 0..23 and the payload
    28      4     reserved  0 (outside the crc, so checked on its own)
    32      ...   payload   ids int64[count]; for inserts then vectors [count, dim] in the index
                            dtype; zero-padded to a multiple of 8 bytes (so records stay 8-aligned)

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

from tiers.io import CorruptionError, Env, FileHandle, IOEngine, default_env, map_os_errors
from tiers.storage import fsync_directory

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


def read_segment(
    path: str, dim: int, dtype: Any, *, newest: bool | None = None
) -> tuple[list[WalRecord], int]:
    """Records of one segment and the byte length of its valid prefix (the rest: a torn tail).

    ``newest``: whether no later segment exists (by default, looked up in the directory). Raises
    CorruptionError where a failed record cannot be a torn tail (see the module docstring).
    """
    with map_os_errors(path), open(path, "rb") as f:
        data = f.read()
    records: list[WalRecord] = []
    offset = 0
    while (parsed := _parse(data, offset, dim, dtype)) is not None:
        records.append(parsed[0])
        offset = parsed[1]
    if offset < len(data):
        _check_torn_tail(path, data, offset, dim, dtype, newest)
    return records, offset


def _payload_bytes(kind: int, count: int, dim: int, itemsize: int) -> int:
    size = count * 8 + (count * dim * itemsize if kind == INSERT else 0)
    return size + -size % 8


def _parse(data: bytes, offset: int, dim: int, dtype: Any) -> tuple[WalRecord, int] | None:
    """(the record at ``offset``, where it ends) if a whole record that passes its checks is
    there, else None."""
    if offset + _HEADER.itemsize > len(data):
        return None
    header = np.frombuffer(data, _HEADER, 1, offset)[0]
    kind, count, start = int(header["kind"]), int(header["count"]), offset + _HEADER.itemsize
    end = start + int(header["payload"])
    if header["magic"] != _MAGIC or header["r1"] != 0 or kind not in (INSERT, DELETE):
        return None
    if end > len(data) or end - start != _payload_bytes(kind, count, dim, np.dtype(dtype).itemsize):
        return None
    if zlib.crc32(data[start:end], zlib.crc32(data[offset : offset + 24])) != header["crc"]:
        return None
    ids = np.frombuffer(data, np.int64, count, start).copy()
    vectors = None
    if kind == INSERT:
        vectors = np.frombuffer(data, dtype, count * dim, start + count * 8).reshape(count, dim)
    record = WalRecord(kind, int(header["lsn"]), ids, None if vectors is None else vectors.copy())
    return record, end


def _check_torn_tail(
    path: str, data: bytes, offset: int, dim: int, dtype: Any, newest: bool | None
) -> None:
    """CorruptionError unless the failed record at ``offset`` can be a crash's torn append."""
    magic = _MAGIC.to_bytes(4, "little")
    at = data.find(magic, offset + 8)
    while at >= 0:  # records are 8-aligned: a whole one after the failure proves damage
        if at % 8 == 0 and _parse(data, at, dim, dtype) is not None:
            raise CorruptionError(
                f"WAL record at byte {offset} of {path} fails its check, yet a whole record "
                f"follows at byte {at}",
                path,
                offset,
            )
        at = data.find(magic, at + 1)
    if not (_is_newest(path) if newest is None else newest):
        raise CorruptionError(
            f"WAL record at byte {offset} of {path} fails its check, and a later segment "
            "exists: only the newest can end in a torn append",
            path,
            offset,
        )


def _is_newest(path: str) -> bool:
    """No later segment lies beside ``path`` (a file not named as a segment has none)."""
    match = _SEGMENT.match(os.path.basename(path))
    if match is None:
        return True
    return max(list_segments(os.path.dirname(path) or "."), default=-1) <= int(match[1])


def list_segments(directory: str, env: Env = default_env) -> list[int]:
    with map_os_errors(directory):
        names = env.listdir(directory)
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
        """Append to segment ``seq`` from ``valid_bytes`` (a torn tail beyond is cut off).

        The segment appended to so far is first cut to its last acknowledged record (a failed
        append may have left part of one): only the newest segment may end in a torn record.
        """
        old = self._file
        if old is not None and self.engine.file_size(old) != self.bytes_written:
            await self._cut(old, self.bytes_written)
        path = os.path.join(self.directory, segment_name(seq))
        file = await self.engine.open(path, write=True, create=True)
        await self._cut(file, valid_bytes)
        await asyncio.to_thread(fsync_directory, self.engine.env, self.directory)
        self._file, self.seq, self.bytes_written = file, seq, valid_bytes
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
        env = self.engine.env
        for old in list_segments(self.directory, env):
            if old < seq:
                with map_os_errors(self.directory):
                    env.unlink(os.path.join(self.directory, segment_name(old)))

    async def _cut(self, file: FileHandle, length_bytes: int) -> None:
        with map_os_errors(file.path):
            os.truncate(file.path, length_bytes)
        await self.engine.fsync(file)

    async def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            await self.engine.close_file(file)
