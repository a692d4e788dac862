"""PointStore: a collection's points in LMDB, the truth the index is derived from.

Databases of the environment (``<collection>/points/``)::

    points   internal id (u64 BE)  -> point record (point_records.py)
    ids      point key (points.point_key) -> internal id (u64 BE)
    keys     internal id -> point key (a hit's id without decoding its record)
    meta     b"config" -> JSON CollectionConfig; b"indexes" -> JSON [field, ...];
             b"next_id" -> u64 BE, the next internal id to give
    intents  seq (u64 BE) -> JSON [[op, ...], ...]: index changes a committed write still owes

A write is one LMDB transaction (synced: durable once it returns), run on the store's private
thread so the event loop never waits for an fsync; each write's intent lists what the index
must then do. An internal id belongs to one point for good (an overwrite keeps it), so
replaying the intents in order is idempotent (intents.py).

Thread-safety: reads from any thread (short read transactions); ``write`` from the loop thread
only, one at a time (the collection's write lock).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

from tiers.storage import LmdbWriter, lmdb_errors, open_lmdb, write_growing
from vectordb.collections.point_records import (
    PointRecord,
    decode_record,
    encode_record,
    internal_key,
)

__all__ = ["PointStore", "StoreChange"]

_U64 = struct.Struct(">Q")
_INITIAL_MAP_BYTES = 64 << 20


@dataclass
class StoreChange:
    """One transaction's worth of changes."""

    records: dict[int, PointRecord] = field(default_factory=dict)
    dropped: list[int] = field(default_factory=list)  # internal ids whose records go
    mapped: dict[bytes, int] = field(default_factory=dict)  # point key -> internal id
    unmapped: list[bytes] = field(default_factory=list)
    meta: dict[bytes, bytes] = field(default_factory=dict)
    intent: list[list[Any]] | None = None
    done_intents: list[int] = field(default_factory=list)


class PointStore:
    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self._data_path = os.path.join(path, "data.mdb")
        self._env = open_lmdb(
            path, map_bytes=_INITIAL_MAP_BYTES, max_dbs=5, subdir=True, sync=True, metasync=True
        )
        with lmdb_errors(self._data_path):
            self._points = self._env.open_db(b"points")
            self._ids = self._env.open_db(b"ids")
            self._keys = self._env.open_db(b"keys")
            self._meta = self._env.open_db(b"meta")
            self._intents = self._env.open_db(b"intents")
        self._writer: LmdbWriter[StoreChange] = LmdbWriter(self._commit, "tierkit-points")
        next_id = self.meta(b"next_id")
        self.next_id = _U64.unpack(next_id)[0] if next_id else 0
        self.next_seq = max((seq for seq, _ in self.intents()), default=-1) + 1

    # ----------------------------------------------------------------- reads
    def meta(self, key: bytes) -> bytes | None:
        with lmdb_errors(self._data_path), self._env.begin(db=self._meta) as txn:
            value = txn.get(key)
        return None if value is None else bytes(value)

    def meta_json(self, key: bytes) -> Any:
        value = self.meta(key)
        return None if value is None else orjson.loads(value)

    def lookup(self, keys: list[bytes]) -> list[int | None]:
        """The internal id of each point key (None: no such point)."""
        with lmdb_errors(self._data_path), self._env.begin(db=self._ids) as txn:
            found = [txn.get(key) for key in keys]
        return [None if v is None else _U64.unpack(v)[0] for v in found]

    def point_keys(self, internal_ids: list[int]) -> list[bytes | None]:
        """The point key of each internal id (None: no such point)."""
        with lmdb_errors(self._data_path), self._env.begin(db=self._keys) as txn:
            found = [txn.get(internal_key(i)) for i in internal_ids]
        return [None if v is None else bytes(v) for v in found]

    def records(self, internal_ids: list[int]) -> list[PointRecord | None]:
        with lmdb_errors(self._data_path), self._env.begin(db=self._points) as txn:
            values = [txn.get(internal_key(i)) for i in internal_ids]
        return [
            None if v is None else decode_record(i, v, self._data_path)
            for i, v in zip(internal_ids, values, strict=True)
        ]

    def count(self) -> int:
        with lmdb_errors(self._data_path), self._env.begin() as txn:
            return int(txn.stat(self._points)["entries"])

    def scan(self) -> Iterator[tuple[int, PointRecord]]:
        """Every record, in internal id order (one read transaction: a consistent view)."""
        with lmdb_errors(self._data_path), self._env.begin(db=self._points) as txn:
            for key, value in txn.cursor():
                internal_id = _U64.unpack(key)[0]
                yield internal_id, decode_record(internal_id, value, self._data_path)

    def keyed(self, start: bytes | None) -> Iterator[tuple[bytes, PointRecord]]:
        """(point key, record) from the first key >= ``start`` on, in key order: integer ids
        ascending, then UUIDs by their bytes (one read transaction: a consistent view)."""
        with lmdb_errors(self._data_path), self._env.begin() as txn:
            cursor = txn.cursor(db=self._ids)
            found = cursor.set_range(start) if start is not None else cursor.first()
            while found:
                internal_id = _U64.unpack(cursor.value())[0]
                value = txn.get(internal_key(internal_id), db=self._points)
                if value is not None:
                    yield bytes(cursor.key()), decode_record(internal_id, value, self._data_path)
                found = cursor.next()

    def intents(self) -> list[tuple[int, list[list[Any]]]]:
        with lmdb_errors(self._data_path), self._env.begin(db=self._intents) as txn:
            return [(_U64.unpack(k)[0], orjson.loads(v)) for k, v in txn.cursor()]

    # ----------------------------------------------------------------- writes
    def take_ids(self, n: int) -> list[int]:
        """``n`` new internal ids; the next write persists the counter (an id given but not
        written is never reused either: the counter only grows)."""
        first, self.next_id = self.next_id, self.next_id + n
        return list(range(first, first + n))

    async def write(self, change: StoreChange) -> int | None:
        """Commit ``change`` durably; returns its intent's sequence number (None: none)."""
        seq = None
        if change.intent is not None:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            change.meta[b"intent_seq"] = _U64.pack(seq)
        change.meta[b"next_id"] = _U64.pack(self.next_id)
        await self._writer.submit([change])
        return seq

    async def _commit(self, batch: list[StoreChange]) -> None:
        await self._writer.call(self._commit_now, batch)

    def _commit_now(self, batch: list[StoreChange]) -> None:
        with lmdb_errors(self._data_path):
            write_growing(self._env, lambda txn: self._apply(txn, batch))

    def _apply(self, txn: Any, batch: list[StoreChange]) -> None:
        for change in batch:
            for internal_id in change.dropped:
                txn.delete(internal_key(internal_id), db=self._points)
                txn.delete(internal_key(internal_id), db=self._keys)
            for key in change.unmapped:
                txn.delete(key, db=self._ids)
            for internal_id, record in change.records.items():
                value = encode_record(internal_id, record)
                txn.put(internal_key(internal_id), value, db=self._points)
            for key, internal_id in change.mapped.items():
                txn.put(key, _U64.pack(internal_id), db=self._ids)
                txn.put(internal_key(internal_id), key, db=self._keys)
            for key, value in change.meta.items():
                txn.put(key, value, db=self._meta)
            for seq in change.done_intents:
                txn.delete(_U64.pack(seq), db=self._intents)
            if change.intent is not None:
                seq = _U64.unpack(change.meta[b"intent_seq"])[0]
                txn.put(_U64.pack(seq), orjson.dumps(change.intent), db=self._intents)

    async def aclose(self) -> None:
        await self._writer.close()
        self._env.close()
