"""RecordLog: a segmented write-ahead log; a record is durable before its append returns.

The log carries records of a ``kind`` byte, a 32-bit ``aux`` word and an opaque payload, both
the user's (the vector index: insert or delete, the number of ids, the ids and vectors). A
record check ``check(kind, aux, payload_bytes) -> bool`` lets the user reject records whose
header cannot be one of theirs, so such bytes read as a failed record, not a bad payload.

Segments ``wal-<seq:08d>.log`` in one directory. The owner starts a new segment at each
checkpoint and, once the checkpoint is durable, drops the older ones; ``recover`` replays the
segments from the checkpoint's on, then appends after the last whole record.

Record layout (little-endian; every record starts 8-aligned)::

    offset  size  field
    0       4     magic     0x31574B54 ("TKW1")
    4       1     kind      the user's record type
    5       3     reserved  0 (inside the crc)
    8       8     lsn       uint64, +1 per record across segments
    16      4     aux       uint32, the user's (the vector index: number of ids)
    20      4     payload   bytes that follow the header, a multiple of 8
    24      4     crc32     zlib.crc32 of bytes 0..23, then of the payload
    28      4     reserved  0 (outside the crc, so checked on its own)
    32      ...   payload   the user's bytes, zero-padded by the log to a multiple of 8

Torn tail versus damage: appends are serialised and each is fdatasynced before it is
acknowledged, so a crash can tear only the last record of the newest segment (and starting a
new segment first cuts the old one to its last acknowledged record). A record that fails its
check therefore ends the log as a torn tail, cut off on recovery, exactly when it is in the
newest segment and no whole record follows it. A failed record with a whole record after it, or
at the end of an older segment, is damage to acknowledged records: CorruptionError naming the
file and offset, never a silent cut. (So a flipped byte in the very last record reads as a torn
append; nothing in the bytes tells the two apart.) On recovery the segments must run on from
the checkpoint's without a gap, and the LSNs on from the checkpoint's ``next_lsn`` one by one:
a lost segment or lost records are a CorruptionError, not a silent gap.

Concurrency: loop thread; appends are serialised (write + fdatasync under one lock), so the
order of records is the order of acknowledgement. Reading a segment is a blocking call.
"""

from __future__ import annotations

import asyncio
import os
import re
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tiers.io.engine import FileHandle, IOEngine
from tiers.io.env import Env, default_env
from tiers.io.errors import CorruptionError, FileMissingError, map_os_errors
from tiers.storage.directory import fsync_directory

__all__ = ["LOG_MAGIC", "LogRecord", "RecordCheck", "RecordLog"]

LOG_MAGIC = 0x31574B54
_HEADER = struct.Struct("<IB3xQIIII")  # magic kind - lsn aux payload crc reserved
_CRC_COVERS = 24  # header bytes under the crc
_SEGMENT = re.compile(r"^wal-(\d{8})\.log$")
RecordCheck = Callable[[int, int, int], bool]  # (kind, aux, payload_bytes) -> could be ours


def _any_record(kind: int, aux: int, payload_bytes: int) -> bool:
    return True


@dataclass(frozen=True)
class LogRecord:
    kind: int
    lsn: int
    aux: int
    payload: memoryview  # padding included; a view of the segment's bytes


class RecordLog:
    """The open tail segment of one directory's log; ``append`` returns once durable."""

    def __init__(self, engine: IOEngine, directory: str) -> None:
        self.engine = engine
        self.directory = directory
        self.seq = -1
        self.next_lsn = 1
        self.bytes_written = 0  # in the current segment
        self._file: FileHandle | None = None
        self._lock = asyncio.Lock()

    # ----------------------------------------------------------------- format
    @staticmethod
    def segment_name(seq: int) -> str:
        return f"wal-{seq:08d}.log"

    @staticmethod
    def list_segments(directory: str, env: Env = default_env) -> list[int]:
        with map_os_errors(directory):
            names = env.listdir(directory)
        return sorted(int(m.group(1)) for n in names if (m := _SEGMENT.match(n)))

    @staticmethod
    def encode(kind: int, lsn: int, aux: int, payload: bytes) -> bytes:
        """The bytes of one record (the payload zero-padded to a multiple of 8)."""
        payload = bytes(payload) + b"\0" * (-len(payload) % 8)
        head = _HEADER.pack(LOG_MAGIC, kind, lsn, aux, len(payload), 0, 0)
        crc = zlib.crc32(payload, zlib.crc32(head[:_CRC_COVERS]))
        return _HEADER.pack(LOG_MAGIC, kind, lsn, aux, len(payload), crc, 0) + payload

    @staticmethod
    def read_segment(
        path: str, check: RecordCheck = _any_record, *, newest: bool | None = None
    ) -> tuple[list[LogRecord], int]:
        """Records of one segment and the byte length of its valid prefix (the rest: a torn
        tail). ``newest``: whether no later segment exists (by default, looked up beside it).
        Raises CorruptionError where a failed record cannot be a torn tail."""
        with map_os_errors(path), open(path, "rb") as f:
            data = memoryview(f.read())
        records: list[LogRecord] = []
        offset = 0
        while (record := _parse(data, offset, check)) is not None:
            records.append(record)
            offset += _HEADER.size + len(record.payload)
        if offset < len(data):
            _check_torn_tail(path, data, offset, check, newest)
        return records, offset

    # ----------------------------------------------------------------- writing
    async def start_segment(self, seq: int, valid_bytes: int = 0) -> None:
        """Append to segment ``seq`` from ``valid_bytes`` (a torn tail beyond is cut off).

        The segment appended to so far is first cut to its last acknowledged record (a failed
        append may have left part of one): only the newest segment may end in a torn record.
        """
        old = self._file
        if old is not None and self.engine.file_size(old) != self.bytes_written:
            await self._cut(old, self.bytes_written)
        path = os.path.join(self.directory, self.segment_name(seq))
        file = await self.engine.open(path, write=True, create=True)
        await self._cut(file, valid_bytes)
        await asyncio.to_thread(fsync_directory, self.engine.env, self.directory)
        self._file, self.seq, self.bytes_written = file, seq, valid_bytes
        if old is not None:
            await self.engine.close_file(old)

    async def append(self, kind: int, aux: int, payload: bytes) -> int:
        """Write one record and fdatasync it; returns its LSN. On an error nothing is
        acknowledged: the LSN is not used and the next append writes over the failed bytes."""
        async with self._lock:
            assert self._file is not None, "start_segment first"
            lsn = self.next_lsn
            record = self.encode(kind, lsn, aux, payload)
            await self.engine.write_from(self._file, self.bytes_written, record)
            await self.engine.fsync(self._file, datasync=True)
            self.next_lsn += 1
            self.bytes_written += len(record)
            return lsn

    def drop_segments_before(self, seq: int) -> None:
        env = self.engine.env
        for old in self.list_segments(self.directory, env):
            if old < seq:
                with map_os_errors(self.directory):
                    env.unlink(os.path.join(self.directory, self.segment_name(old)))

    async def recover(
        self, start_seq: int, check: RecordCheck = _any_record
    ) -> AsyncIterator[LogRecord]:
        """Yield every record of segments ``start_seq`` on, checking that no segment is missing
        and that LSNs run on from ``next_lsn``; then append after the last whole record."""
        listed = self.list_segments(self.directory, self.engine.env)
        segments = [seq for seq in listed if seq >= start_seq] or [start_seq]
        for expected, seq in enumerate(segments, start_seq):
            if seq != expected:  # a lost middle segment would drop acknowledged records
                path = os.path.join(self.directory, self.segment_name(expected))
                raise CorruptionError(f"write-ahead log segment {path} is missing", path)
        valid_bytes = 0
        for seq in segments:
            path = os.path.join(self.directory, self.segment_name(seq))
            try:
                records, valid_bytes = self.read_segment(path, check, newest=seq == segments[-1])
            except FileMissingError:
                records, valid_bytes = [], 0
            for record in records:
                if record.lsn != self.next_lsn:
                    raise CorruptionError(
                        f"{path}: write-ahead log record LSN {record.lsn} where "
                        f"{self.next_lsn} was due: acknowledged updates are missing (a lost "
                        "or damaged log segment)",
                        path,
                    )
                self.next_lsn += 1
                yield record
        await self.start_segment(segments[-1], valid_bytes)

    async def close(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            await self.engine.close_file(file)

    async def _cut(self, file: FileHandle, length_bytes: int) -> None:
        with map_os_errors(file.path):
            os.truncate(file.path, length_bytes)
        await self.engine.fsync(file)


def _parse(data: memoryview, offset: int, check: RecordCheck) -> LogRecord | None:
    """The record at ``offset`` if a whole one that passes its checks is there, else None."""
    if offset + _HEADER.size > len(data):
        return None
    magic, kind, lsn, aux, size, crc, reserved = _HEADER.unpack_from(data, offset)
    start = offset + _HEADER.size
    if magic != LOG_MAGIC or reserved != 0 or size % 8 or start + size > len(data):
        return None
    if not check(kind, aux, size):
        return None
    payload = data[start : start + size]
    if zlib.crc32(payload, zlib.crc32(data[offset : offset + _CRC_COVERS])) != crc:
        return None
    return LogRecord(kind, lsn, aux, payload)


def _check_torn_tail(
    path: str, data: memoryview, offset: int, check: RecordCheck, newest: bool | None
) -> None:
    """CorruptionError unless the failed record at ``offset`` can be a crash's torn append."""
    raw, magic = data.obj, LOG_MAGIC.to_bytes(4, "little")
    assert isinstance(raw, bytes)
    at = raw.find(magic, offset + 8)
    while at >= 0:  # records are 8-aligned: a whole one after the failure proves damage
        if at % 8 == 0 and _parse(data, at, check) is not None:
            raise CorruptionError(
                f"WAL record at byte {offset} of {path} fails its check, yet a whole record "
                f"follows at byte {at}",
                path,
                offset,
            )
        at = raw.find(magic, at + 1)
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
    later = RecordLog.list_segments(os.path.dirname(path) or ".")
    return max(later, default=-1) <= int(match[1])
