"""PointStore: a collection's points in LMDB, the truth the index is derived from.

Databases of the environment (``<collection>/points/``)::

    points   internal id (u64 BE)  -> point record (point_records.py)
    ids      point key (points.point_key) -> internal id (u64 BE)
    keys     internal id -> point key (a hit's id without decoding its record)
    meta     b"config" -> JSON CollectionConfig; b"indexes" -> JSON [field, ...];
             b"next_id" -> u64 BE, the next internal id to give
    intents  seq (u64 BE) -> JSON [[op, ...], ...]: index changes a committed write still owes

Vectors are not in LMDB but in ``vectors.dat`` (vector_file.py), read with ``pread`` only when a
caller uses a record's ``vector``: LMDB reads through its memory map, and with the vectors
inline every record filled a page that stayed in the process's resident set once touched.
The environment is opened without readahead (MADV_RANDOM: a cold read maps its page, not the
~0.5 MiB around it).

A write is one LMDB transaction (synced: durable once it returns), run on the store's private
thread so the event loop never waits for an fsync; the vectors it changes are written to the
slots their committed records do not name and synced first. Each write's intent lists what
the index must then do. An internal id belongs to one point for good (an overwrite keeps it), so
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

import numpy as np
import orjson

from tiers.storage import LmdbWriter, lmdb_errors, open_lmdb, write_growing
from vectordb.collections.point_records import (
    PointRecord,
    decode_record,
    encode_record,
    internal_key,
    stored_slot,
)
from vectordb.collections.points import CollectionConfig
from vectordb.collections.vector_file import VectorChanged, VectorFile, vector_crc

__all__ = ["PointStore", "StoreChange"]

_U64 = struct.Struct(">Q")
_INITIAL_MAP_BYTES = 64 << 20
_VECTOR_FILE = "vectors.dat"
_REREADS = 3  # a slot rewritten under a reader: read the record again this many times


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
            path,
            map_bytes=_INITIAL_MAP_BYTES,
            max_dbs=5,
            subdir=True,
            sync=True,
            metasync=True,
            readahead=False,
        )
        self._vectors = VectorFile(os.path.join(path, _VECTOR_FILE))
        self._dim: int | None = None
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
            None if v is None else self._decode(i, v)
            for i, v in zip(internal_ids, values, strict=True)
        ]

    def _decode(self, internal_id: int, value: bytes) -> PointRecord:
        return decode_record(internal_id, value, self._data_path, self._load_vector)

    def _load_vector(self, internal_id: int, slot: tuple[int, int]) -> np.ndarray:
        """The vector in ``slot``; when a later write rewrote it, the point's current one."""
        for _ in range(_REREADS):
            try:
                return self._vectors.read(internal_id, slot[0], slot[1], self.dim)
            except VectorChanged:
                with lmdb_errors(self._data_path), self._env.begin(db=self._points) as txn:
                    value = txn.get(internal_key(internal_id))
                    now = stored_slot(internal_id, value, self._data_path)
                if now is None or now == slot:
                    break  # the record still names this slot: the slot is damaged
                slot = now
        raise self._vectors.damaged(internal_id)

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = CollectionConfig.from_dict(self.meta_json(b"config")).dim
        return self._dim

    def count(self) -> int:
        with lmdb_errors(self._data_path), self._env.begin() as txn:
            return int(txn.stat(self._points)["entries"])

    def scan(self) -> Iterator[tuple[int, PointRecord]]:
        """Every record, in internal id order (one read transaction: a consistent view)."""
        with lmdb_errors(self._data_path), self._env.begin(db=self._points) as txn:
            for key, value in txn.cursor():
                internal_id = _U64.unpack(key)[0]
                yield internal_id, self._decode(internal_id, value)

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
                    yield bytes(cursor.key()), self._decode(internal_id, value)
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
        slots = self._write_vectors(txn, batch)
        for change in batch:
            for internal_id in change.dropped:
                txn.delete(internal_key(internal_id), db=self._points)
                txn.delete(internal_key(internal_id), db=self._keys)
            for key in change.unmapped:
                txn.delete(key, db=self._ids)
            for internal_id, record in change.records.items():
                value = encode_record(internal_id, record, slots[internal_id])
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

    def _write_vectors(self, txn: Any, batch: list[StoreChange]) -> dict[int, tuple[int, int]]:
        """Each written record's slot (side, crc): the committed one when its vector did not
        change, else the other side, written and synced here, before the records commit. The
        sides come from the committed records (read before this transaction puts any), so a
        rerun of the transaction (write_growing) writes the same slots again."""
        final: dict[int, PointRecord] = {}
        for change in batch:
            final.update(change.records)  # a later change of the same point wins
        slots: dict[int, tuple[int, int]] = {}
        for internal_id, record in final.items():
            value = txn.get(internal_key(internal_id), db=self._points)
            committed = stored_slot(internal_id, value, self._data_path)
            if record.stored is not None and record.stored == committed:
                slots[internal_id] = committed
                continue
            side = 1 - committed[0] if committed is not None else 0
            data = np.ascontiguousarray(record.vector, dtype="<f4").tobytes()
            self._vectors.write(internal_id, side, data)
            slots[internal_id] = (side, vector_crc(internal_id, side, data))
        self._vectors.sync()
        return slots

    async def aclose(self) -> None:
        await self._writer.close()
        self._env.close()
        self._vectors.close()
