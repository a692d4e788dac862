"""MetaStore: the index's checkpoint (``<index>/meta``): LMDB records naming files of arrays.

What a checkpoint holds: the config, a small JSON state (counters, the WAL segment replay starts
from, the posting file's size) and named numpy arrays (heads, posting directory, version map).
A commit is durable (LMDB ``sync=True``) and atomic: a crash leaves the previous checkpoint whole.

Records of the default database, every value *sealed* as in tiers.storage's ``seal`` (its
body, then ``zlib.crc32(key + body)`` as a little-endian u32), so a flipped byte in a key or a
value fails the check of its record::

    b"format"     "<II": format version (3), number of records in the database (this one too)
    b"config"     JSON object
    b"state"      JSON object
    b"a:<name>"   a small array (.npy bytes up to _INLINE_MAX_BYTES) as .npy bytes (np.save)
    b"f:<name>"   "<QQI" (generation, .npy bytes, crc32 of them), then the file's name in
                  ``arrays.<generation>/``: a larger array, as a plain .npy file

Why the larger arrays are files: LMDB reads through its map, and replacing an overflow value
touches the old one's pages, so a checkpoint every few minutes kept the rewritten arrays'
pages resident in the process (the REST soak: +9.5 MiB per 150 s, levelling off only at the
file's size). Files written with ``write`` and read with ``readinto`` stay in the page cache,
outside the process. A write puts every file in a new ``arrays.<generation>/`` directory and
fsyncs them, the directory and ``meta/`` before the LMDB commit names them; older generations
are removed after it (and any a crash left behind, at the next write): the commit stays the one
atomic step. Reading checks each file's length and CRC-32 as it is read into its final array.

A write replaces every record, so the count is exact. Opening (tiers.storage's ``open_lmdb``)
runs the structural check of ``data.mdb`` (LMDB itself trusts its pages); reading checks every
record and the count (a record LMDB no longer reaches is caught too). Either raises
CorruptionError naming ``data.mdb`` (or the array file) rather than return a wrong config, a
missing array or None for an index that exists. Format 2 (every array inline) is read as is;
format 1 (no ``format`` record; bare JSON whose state holds ``"format": 1``; arrays as
``crc32(npy) + npy``) is still read, with only its arrays checked; the next checkpoint rewrites
either as format 3.

Concurrency: blocking calls; the index runs them in a worker thread, one at a time.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from tiers.io import CorruptionError, default_env
from tiers.storage import fsync_directory, lmdb_errors, open_lmdb, seal, unseal, write_growing
from vectordb.meta_files import read_npy, write_npy

__all__ = ["META_FORMAT_VERSION", "Checkpoint", "MetaStore", "Narrow"]

Narrow = Callable[[str, int], Any]  # (array name, stored bytes) -> dtype to hold it in, or None

META_FORMAT_VERSION = 3
_READ_FORMATS = (2, 3)
_FORMAT = struct.Struct("<II")
_CRC = struct.Struct("<I")
_FILE = struct.Struct("<QQI")  # generation, .npy bytes, crc32
_MAP_BYTES = 1 << 30
_INLINE_MAX_BYTES = 2048  # larger .npy values would take LMDB overflow pages: files instead
_ARRAYS = "arrays."  # + the generation, 16 hex digits


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

    def read(self, narrow: Narrow | None = None) -> Checkpoint | None:
        """The last committed checkpoint, or None for a new index.

        Each record is checked and decoded straight from LMDB's mapped pages, one at a time:
        an array is copied once, into its final place (copying every record first held three
        copies of the heads at once: the peak that kept an index from opening in 15% of its
        vectors' bytes). ``narrow(name, nbytes)`` may name a smaller dtype an array is to be
        held in (converted straight from the mapped pages, never held at full width)."""
        with lmdb_errors(self.data_path), self._env.begin(buffers=True) as txn:
            if txn.get(b"format") is None:
                records = {bytes(key): bytes(value) for key, value in txn.cursor()}
                return self._read_format_1(records) if records else None
            bodies: dict[bytes, bytes] = {}
            arrays: dict[bytes, np.ndarray] = {}
            for view_key, view in txn.cursor():
                key = bytes(view_key)
                body = unseal(key, view, self.data_path)
                if key.startswith(b"a:"):
                    dtype = narrow(key[2:].decode(errors="replace"), len(body)) if narrow else None
                    arrays[key] = self._array(key, body, dtype)[1]
                elif key.startswith(b"f:"):
                    arrays[b"a:" + key[2:]] = self._file_array(key, bytes(body), narrow)
                else:
                    bodies[key] = bytes(body)
        return self._checked(bodies, arrays)

    def read_config(self) -> dict[str, Any] | None:
        """The config of the last checkpoint (its record checked), or None for a new index;
        the arrays are left where they are (opening reads them once, in load_checkpoint)."""
        with lmdb_errors(self.data_path), self._env.begin(buffers=True) as txn:
            format_2 = txn.get(b"format") is not None
            sealed = txn.get(b"config")
            config = None if sealed is None else bytes(sealed)
        if not format_2:  # format 1 (or nothing): the whole read, as before
            checkpoint = self.read()
            return None if checkpoint is None else checkpoint.config
        if config is None:
            raise self._corrupt("checkpoint has no config record")
        return self._json(b"config", {b"config": unseal(b"config", config, self.data_path)})

    def _checked(self, bodies: dict[bytes, bytes], arrays: dict[bytes, np.ndarray]) -> Checkpoint:
        stamp = bodies[b"format"]
        version, count = _FORMAT.unpack(stamp) if len(stamp) == _FORMAT.size else (None, 0)
        if version not in _READ_FORMATS:
            raise self._corrupt(f"unknown index format {version}")
        held = len(bodies) + len(arrays)
        if held != count:  # LMDB lost a record, or holds one it was never given
            raise self._corrupt(f"checkpoint holds {held} records, its count says {count}")
        keys = (set(bodies) | set(arrays)) - {b"format"}
        return self._checkpoint(bodies, arrays, keys)

    def write(self, checkpoint: Checkpoint) -> None:
        values = {
            b"config": json.dumps(checkpoint.config).encode(),
            b"state": json.dumps(checkpoint.state).encode(),
        }
        generation = self._next_generation()
        folder = os.path.join(self.path, f"{_ARRAYS}{generation:016x}")
        os.makedirs(folder)
        for name, array in checkpoint.arrays.items():
            array = np.ascontiguousarray(array)
            if array.nbytes <= _INLINE_MAX_BYTES:
                buffer = io.BytesIO()
                np.save(buffer, array, allow_pickle=False)
                if buffer.tell() <= _INLINE_MAX_BYTES:
                    values[b"a:" + name.encode()] = buffer.getvalue()
                    continue
            file_name = f"{len(values)}.npy"
            nbytes, crc = write_npy(os.path.join(folder, file_name), array)
            values[b"f:" + name.encode()] = _FILE.pack(generation, nbytes, crc) + file_name.encode()
        # the files' names, then the folder's, before a record names them
        fsync_directory(default_env, folder)
        fsync_directory(default_env, self.path)
        values[b"format"] = _FORMAT.pack(META_FORMAT_VERSION, len(values) + 1)
        with lmdb_errors(self.data_path):
            write_growing(self._env, lambda txn: self._replace_all(txn, values))
        self._remove_generations(keep=generation)

    def update_state(self, values: dict[str, Any], if_next_lsn: int) -> bool:
        """Merge ``values`` into the state of the last checkpoint, in place and durably, if
        that checkpoint is still the one whose ``next_lsn`` is ``if_next_lsn`` (a figure
        measured on a checkpoint's state is kept with that checkpoint only; a newer one, or an
        index of format 1, gets nothing: False). One LMDB transaction: the record count and the
        arrays are unchanged, and a crash leaves the old state or the new one."""
        done = False

        def merge(txn: Any) -> None:
            nonlocal done
            done = False  # write_growing may run it again on a grown map
            sealed = txn.get(b"state")
            if txn.get(b"format") is None or sealed is None:
                return
            state = self._json(b"state", {b"state": unseal(b"state", sealed, self.data_path)})
            if state.get("next_lsn") != if_next_lsn:
                return
            state.update(values)
            txn.put(b"state", seal(b"state", json.dumps(state).encode()))
            done = True

        with lmdb_errors(self.data_path):
            write_growing(self._env, merge)
        return done

    def close(self) -> None:
        self._env.close()

    # ----------------------------------------------------------------- internals
    def _generations(self) -> list[int]:
        found = []
        for entry in os.listdir(self.path):
            if entry.startswith(_ARRAYS):
                try:
                    found.append(int(entry[len(_ARRAYS) :], 16))
                except ValueError:
                    continue
        return found

    def _next_generation(self) -> int:
        """One past every generation on disk: the committed one and any a crash left behind
        (never reused, so a record never names a folder another write has filled)."""
        return max(self._generations(), default=0) + 1

    def _remove_generations(self, keep: int) -> None:
        for generation in self._generations():
            if generation != keep:
                shutil.rmtree(os.path.join(self.path, f"{_ARRAYS}{generation:016x}"))

    def _file_array(self, key: bytes, body: bytes, narrow: Narrow | None) -> np.ndarray:
        """The array an ``f:<name>`` record names, read from its file and checked."""
        if len(body) <= _FILE.size:
            raise self._corrupt(f"checkpoint value {key[:64]!r} is not a file record")
        generation, nbytes, crc = _FILE.unpack_from(body)
        try:
            file_name = body[_FILE.size :].decode()
        except UnicodeDecodeError:
            file_name = ""
        if not file_name or "/" in file_name or file_name.startswith("."):
            raise self._corrupt(f"checkpoint value {key[:64]!r} names no file")
        path = os.path.join(self.path, f"{_ARRAYS}{generation:016x}", file_name)
        name = key[2:].decode(errors="replace")
        dtype = narrow(name, nbytes) if narrow else None
        return read_npy(path, name, nbytes, crc, dtype)

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
                arrays[key] = self._array(key, data)[1]
        checkpoint = self._checkpoint(records, arrays, set(records))
        if checkpoint.state.get("format") != 1:
            raise self._corrupt(f"unknown index format {checkpoint.state.get('format')}")
        return checkpoint

    def _checkpoint(
        self, bodies: dict[bytes, bytes], arrays: dict[bytes, np.ndarray], keys: set[bytes]
    ) -> Checkpoint:
        """The checkpoint from checked record bodies; ``keys``: the records it must consist of."""
        unknown = keys - {b"config", b"state"} - set(arrays)
        if unknown or b"config" not in keys or b"state" not in keys:
            raise self._corrupt(f"checkpoint records {sorted(keys)[:8]} are not a checkpoint")
        config, state = self._json(b"config", bodies), self._json(b"state", bodies)
        return Checkpoint(config, state, {key[2:].decode(): a for key, a in arrays.items()})

    def _json(self, key: bytes, bodies: dict[bytes, bytes]) -> dict[str, Any]:
        try:
            value = json.loads(bodies[key])
        except ValueError:  # UnicodeDecodeError included
            value = None
        if not isinstance(value, dict):
            raise self._corrupt(f"checkpoint value {key.decode()} is not a JSON object")
        return value

    def _array(self, key: bytes, data: Any, dtype: Any = None) -> tuple[str, np.ndarray]:
        """(name, array) of an ``a:<name>`` record whose bytes (``.npy``, possibly a view of
        LMDB's pages) passed their check: the array is one copy of them."""
        try:
            return key[2:].decode(), _npy_copy(data, dtype)
        except (ValueError, EOFError):  # UnicodeDecodeError included; only a foreign writer
            raise self._corrupt(f"checkpoint value {key[:64]!r} is not an array") from None

    def _corrupt(self, what: str) -> CorruptionError:
        return CorruptionError(f"{what} in {self.data_path}", self.data_path)


def _npy_copy(data: Any, as_dtype: Any = None) -> np.ndarray:
    """The array a ``.npy`` buffer holds, copied once out of ``data`` (np.load would copy the
    whole buffer into a stream first); converted to ``as_dtype`` in that copy when given."""
    view = memoryview(data).cast("B")
    head = io.BytesIO(bytes(view[: min(len(view), 1 << 16)]))
    version = np.lib.format.read_magic(head)
    if version == (1, 0):
        shape, fortran, stored = np.lib.format.read_array_header_1_0(head)
    else:
        shape, fortran, stored = np.lib.format.read_array_header_2_0(head)
    if stored.hasobject:
        raise ValueError("object arrays are refused")
    count = int(np.prod(shape, dtype=np.int64))
    flat = np.frombuffer(view, dtype=stored, count=count, offset=head.tell())
    if fortran:
        shaped = flat.reshape(shape, order="F")
        return shaped.astype(as_dtype or stored, order="F")  # astype copies
    return flat.reshape(shape).astype(as_dtype or stored)
