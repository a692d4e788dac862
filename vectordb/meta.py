"""MetaStore: the index's checkpoint in LMDB (``<index>/meta``), written in one transaction.

What a checkpoint holds: the config, a small JSON state (format version, counters, the WAL
segment replay starts from, the posting file's size) and named numpy arrays (heads, posting
directory, version map). Each array is stored as ``crc32 (4 bytes, little-endian) + .npy bytes``
so a damaged value raises CorruptionError instead of loading wrong numbers. A commit is durable
(LMDB ``sync=True``) and atomic: a crash leaves the previous checkpoint whole.

Concurrency: blocking calls; the index runs them in a worker thread, one at a time.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from typing import Any

import lmdb
import numpy as np

from tiers.catalog import lmdb_errors
from tiers.errors import CorruptionError, map_os_errors

__all__ = ["META_FORMAT_VERSION", "Checkpoint", "MetaStore"]

META_FORMAT_VERSION = 1
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
        with lmdb_errors(path), map_os_errors(path):
            self._env = lmdb.open(path, map_size=_MAP_BYTES, subdir=True, sync=True, metasync=True)

    def read(self) -> Checkpoint | None:
        """The last committed checkpoint, or None for a new index."""
        with lmdb_errors(self.path), self._env.begin() as txn:
            raw_config = txn.get(b"config")
            if raw_config is None:
                return None
            config = json.loads(bytes(raw_config))
            state = json.loads(bytes(txn.get(b"state")))
            if state.get("format") != META_FORMAT_VERSION:
                raise CorruptionError(f"unknown index format {state.get('format')}", self.path)
            arrays = {}
            for key, value in txn.cursor():
                if bytes(key).startswith(b"a:"):
                    arrays[bytes(key)[2:].decode()] = self._load_array(bytes(key), bytes(value))
        return Checkpoint(config, state, arrays)

    def write(self, checkpoint: Checkpoint) -> None:
        state = {**checkpoint.state, "format": META_FORMAT_VERSION}
        values = {b"config": json.dumps(checkpoint.config).encode(), b"state": json.dumps(state)}
        for name, array in checkpoint.arrays.items():
            buffer = io.BytesIO()
            np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
            data = buffer.getvalue()
            values[b"a:" + name.encode()] = _CRC.pack(zlib.crc32(data)) + data
        with lmdb_errors(self.path):
            while True:
                try:
                    with self._env.begin(write=True) as txn:
                        for key, value in values.items():
                            txn.put(key, value if isinstance(value, bytes) else value.encode())
                    return
                except lmdb.MapFullError:  # the map is virtual: double it and retry
                    self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def _load_array(self, key: bytes, value: bytes) -> np.ndarray:
        data = value[_CRC.size :]
        if len(value) < _CRC.size or zlib.crc32(data) != _CRC.unpack_from(value)[0]:
            raise CorruptionError(f"checkpoint value {key.decode()} fails its checksum", self.path)
        return np.load(io.BytesIO(data), allow_pickle=False)

    def close(self) -> None:
        self._env.close()
