"""MetaStore: the index's checkpoint in LMDB (``<index>/meta``), written in one transaction.

What a checkpoint holds: the config, a small JSON state (counters, the WAL segment replay starts
from, the posting file's size) and named numpy arrays (heads, posting directory, version map).
A commit is durable (LMDB ``sync=True``) and atomic: a crash leaves the previous checkpoint whole.

Records of the default database, every value *sealed* as in tiers.storage's ``seal`` (its
body, then ``zlib.crc32(key + body)`` as a little-endian u32), so a flipped byte in a key or a
value fails the check of its record::

    b"format"     "<II": format version (2), number of records in the database (this one too)
    b"config"     JSON object
    b"state"      JSON object
    b"a:<name>"   the array as .npy bytes (np.save, no pickles)

A write replaces every record, so the count is exact. Opening (tiers.storage's ``open_lmdb``)
runs the structural check of ``data.mdb`` (LMDB itself trusts its pages); reading checks every
record and the count (a record LMDB no longer reaches is caught too). Either raises
CorruptionError naming ``data.mdb`` rather than return a wrong config, a missing array or None
for an index that exists. Format 1 (no ``format`` record; bare JSON whose state holds
``"format": 1``; arrays as ``crc32(npy) + npy``) is still read, with only its arrays checked;
the next checkpoint rewrites it as format 2.

Concurrency: blocking calls; the index runs them in a worker thread, one at a time.
"""

from __future__ import annotations

import io
import json
import os
import struct
import zlib
from typing import Any

import numpy as np

from tiers.io import CorruptionError
from tiers.storage import lmdb_errors, open_lmdb, seal, unseal, write_growing

__all__ = ["META_FORMAT_VERSION", "Checkpoint", "MetaStore"]

META_FORMAT_VERSION = 2
_FORMAT = struct.Struct("<II")
_CRC = struct.Struct("<I")
_MAP_BYTES = 1 << 30


class Checkpoint:
    def __init__(self, config: dict[str, Any], state: dict[str, Any], arrays: dict[str, Any]):
        self.config = config
        self.state = state
        self.arrays = arrays


class MetaStore:
    def __init__(self, path: str) -> None:
        self.path = path
        self.data_path = os.path.join(path, "data.mdb")  # what a CorruptionError names
        self._env = open_lmdb(path, map_bytes=_MAP_BYTES, subdir=True, sync=True, metasync=True)

    def read(self) -> Checkpoint | None:
        """The last committed checkpoint, or None for a new index."""
        with lmdb_errors(self.data_path), self._env.begin() as txn:
            records = {bytes(key): bytes(value) for key, value in txn.cursor()}
        if not records:
            return None
        if b"format" not in records:
            return self._read_format_1(records)
        bodies = {key: unseal(key, value, self.data_path) for key, value in records.items()}
        stamp = bodies[b"format"]
        version, count = _FORMAT.unpack(stamp) if len(stamp) == _FORMAT.size else (None, 0)
        if version != META_FORMAT_VERSION:
            raise self._corrupt(f"unknown index format {version}")
        if len(bodies) != count:  # LMDB lost a record, or holds one it was never given
            raise self._corrupt(f"checkpoint holds {len(bodies)} records, its count says {count}")
        arrays = {key: body for key, body in bodies.items() if key.startswith(b"a:")}
        return self._checkpoint(bodies, arrays, set(bodies) - {b"format"})

    def write(self, checkpoint: Checkpoint) -> None:
        values = {
            b"config": json.dumps(checkpoint.config).encode(),
            b"state": json.dumps(checkpoint.state).encode(),
        }
        for name, array in checkpoint.arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
            values[b"a:" + name.encode()] = buffer.getvalue()
        values[b"format"] = _FORMAT.pack(META_FORMAT_VERSION, len(values) + 1)
        with lmdb_errors(self.data_path):
            write_growing(self._env, lambda txn: self._replace_all(txn, values))

    def close(self) -> None:
        self._env.close()

    # ----------------------------------------------------------------- internals
    @staticmethod
    def _replace_all(txn: Any, values: dict[bytes, bytes]) -> None:
        stale = [bytes(key) for key in txn.cursor().iternext(values=False)]
        for key in stale:
            if key not in values:
                txn.delete(key)
        for key, body in values.items():
            txn.put(key, seal(key, body))

    def _read_format_1(self, records: dict[bytes, bytes]) -> Checkpoint:
        arrays = {}
        for key, value in records.items():
            if key.startswith(b"a:"):
                data = value[_CRC.size :]
                if len(value) < _CRC.size or zlib.crc32(data) != _CRC.unpack_from(value)[0]:
                    raise self._corrupt(f"checkpoint value {key[:64]!r} fails its checksum")
                arrays[key] = data
        checkpoint = self._checkpoint(records, arrays, set(records))
        if checkpoint.state.get("format") != 1:
            raise self._corrupt(f"unknown index format {checkpoint.state.get('format')}")
        return checkpoint

    def _checkpoint(
        self, bodies: dict[bytes, bytes], arrays: dict[bytes, bytes], keys: set[bytes]
    ) -> Checkpoint:
        """The checkpoint from checked record bodies; ``keys``: the records it must consist of."""
        unknown = keys - {b"config", b"state"} - set(arrays)
        if unknown or b"config" not in keys or b"state" not in keys:
            raise self._corrupt(f"checkpoint records {sorted(keys)[:8]} are not a checkpoint")
        config, state = self._json(b"config", bodies), self._json(b"state", bodies)
        return Checkpoint(
            config, state, dict(self._array(key, data) for key, data in arrays.items())
        )

    def _json(self, key: bytes, bodies: dict[bytes, bytes]) -> dict[str, Any]:
        try:
            value = json.loads(bodies[key])
        except ValueError:  # UnicodeDecodeError included
            value = None
        if not isinstance(value, dict):
            raise self._corrupt(f"checkpoint value {key.decode()} is not a JSON object")
        return value

    def _array(self, key: bytes, data: bytes) -> tuple[str, np.ndarray]:
        """(name, array) of an ``a:<name>`` record whose bytes passed their check."""
        try:
            return key[2:].decode(), np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, EOFError):  # UnicodeDecodeError included; only a foreign writer
            raise self._corrupt(f"checkpoint value {key[:64]!r} is not an array") from None

    def _corrupt(self, what: str) -> CorruptionError:
        return CorruptionError(f"{what} in {self.data_path}", self.data_path)
