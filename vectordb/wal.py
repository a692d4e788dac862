"""The index's write-ahead log: every insert and delete is durable here before it is acknowledged.

The log itself, its segments ``wal-<seq:08d>.log``, its byte layout, the torn-tail versus damage
rules and the LSN checks of recovery, is tiers.storage's RecordLog (see its module docstring).
This module gives its records their meaning::

    kind     1 = insert, 2 = delete; 3-6 = tenancy (inserts with tenants, grants, revokes,
             tenant deletes: their layout is in vectordb.tenancy.wal_records)
    aux      count: the number of ids
    payload  ids int64[count]; for inserts then vectors [count, dim] in the index dtype
             (zero-padded by the log to a multiple of 8 bytes)

A record whose kind is neither, or whose payload size is not the one its count, the index's
``dim`` and dtype give, fails its check like a record with a bad CRC.

Concurrency: loop thread; appends are serialised by the RecordLog, so the order of records is
the order of acknowledgement.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tiers.io import IOEngine
from tiers.storage import LogRecord, RecordCheck, RecordLog
from vectordb.tenancy.wal_records import TENANT_KINDS, decode_tenant_record, plausible

__all__ = [
    "DELETE",
    "INSERT",
    "WalRecord",
    "WriteAheadLog",
    "encode_record",
    "list_segments",
    "read_segment",
    "segment_name",
]

INSERT, DELETE = 1, 2
segment_name = RecordLog.segment_name
list_segments = RecordLog.list_segments


@dataclass
class WalRecord:
    kind: int
    lsn: int
    ids: np.ndarray
    vectors: np.ndarray | None
    tenants: Any = None  # tenancy records: wal_records.decode_tenant_record


def _payload(ids: np.ndarray, vectors: np.ndarray | None) -> bytes:
    payload = np.ascontiguousarray(ids, np.int64).tobytes()
    if vectors is not None:
        payload += np.ascontiguousarray(vectors).tobytes()
    return payload


def encode_record(kind: int, lsn: int, ids: np.ndarray, vectors: np.ndarray | None) -> bytes:
    return RecordLog.encode(kind, lsn, len(ids), _payload(ids, vectors))


def _check(dim: int, dtype: Any) -> RecordCheck:
    itemsize = np.dtype(dtype).itemsize

    def check(kind: int, count: int, payload_bytes: int) -> bool:
        if kind in TENANT_KINDS:
            return plausible(kind, count, payload_bytes, dim * itemsize)
        if kind not in (INSERT, DELETE):
            return False
        size = count * 8 + (count * dim * itemsize if kind == INSERT else 0)
        return payload_bytes == size + -size % 8

    return check


def _decode(record: LogRecord, dim: int, dtype: Any) -> WalRecord:
    count, payload = record.aux, record.payload
    if record.kind in TENANT_KINDS:
        ids, vectors, tenants = decode_tenant_record(record.kind, count, payload, dim, dtype)
        return WalRecord(record.kind, record.lsn, ids, vectors, tenants)
    ids = np.frombuffer(payload, np.int64, count).copy()
    vectors = None
    if record.kind == INSERT:
        vectors = np.frombuffer(payload, dtype, count * dim, count * 8).reshape(count, dim).copy()
    return WalRecord(record.kind, record.lsn, ids, vectors)


def read_segment(
    path: str, dim: int, dtype: Any, *, newest: bool | None = None
) -> tuple[list[WalRecord], int]:
    """Records of one segment and the byte length of its valid prefix (the rest: a torn tail).

    ``newest``: whether no later segment exists (by default, looked up in the directory). Raises
    CorruptionError where a failed record cannot be a torn tail.
    """
    records, valid = RecordLog.read_segment(path, _check(dim, dtype), newest=newest)
    return [_decode(record, dim, dtype) for record in records], valid


class WriteAheadLog:
    """The index's log; ``append`` returns once the record is on stable storage."""

    def __init__(self, engine: IOEngine, directory: str) -> None:
        self.log = RecordLog(engine, directory)

    @property
    def seq(self) -> int:
        return self.log.seq

    @property
    def bytes_written(self) -> int:
        return self.log.bytes_written

    @property
    def next_lsn(self) -> int:
        return self.log.next_lsn

    @next_lsn.setter
    def next_lsn(self, lsn: int) -> None:
        self.log.next_lsn = lsn

    async def start_segment(self, seq: int, valid_bytes: int = 0) -> None:
        await self.log.start_segment(seq, valid_bytes)

    async def append(self, kind: int, ids: np.ndarray, vectors: np.ndarray | None) -> int:
        return await self.log.append(kind, len(ids), _payload(ids, vectors))

    async def append_raw(self, kind: int, count: int, payload: bytes) -> int:
        """Append a record whose payload the caller encoded (tenancy.wal_records)."""
        return await self.log.append(kind, count, payload)

    def drop_segments_before(self, seq: int) -> None:
        self.log.drop_segments_before(seq)

    async def recover(self, start_seq: int, dim: int, dtype: Any) -> AsyncIterator[WalRecord]:
        """Replay the log from segment ``start_seq`` (``next_lsn``: the checkpoint's), then
        append after it. Raises CorruptionError for damage, a lost segment or lost records."""
        async for record in self.log.recover(start_seq, _check(dim, dtype)):
            yield _decode(record, dim, dtype)

    async def close(self) -> None:
        await self.log.close()
