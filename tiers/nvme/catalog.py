"""Catalog: the durable map from key to where its object record lives, kept in LMDB.

On disk, ``<tier dir>/catalog/`` is one LMDB environment (``data.mdb``, ``lock.mdb``) opened with
``sync=True, metasync=True``, so a transaction is on stable storage when its commit returns. It
holds two named databases. Every value is *sealed*: its body, then ``zlib.crc32(key + body)``
as a little-endian u32, so a flipped byte in a key or a value fails the check of its record (a
damaged key cannot pass for another key, nor vanish unnoticed)::

    b"objects"  key: the object key, UTF-8 (1..511 bytes, LMDB's key limit)
                value: 36 bytes, little-endian struct "<IQQIQI" (a base entry and its seal):
                  file_index u32    extent file "extents-<file_index:05d>.dat"
                  offset_bytes u64  where the record starts in that file (4 KiB aligned)
                  size_bytes u64    payload size
                  crc32 u32         zlib.crc32 of the payload (also in the record header);
                                    of a chunked record, that of its chunk CRC table
                  version u64       the put's version (also in the record header)
                  seal u32          zlib.crc32 of the key and the value bytes before it
                or, for a chunked record, 36 + 4 + 4 k bytes: the 32 base bytes, the chunk
                extension (tiers.nvme.format: u16 format 1, u8 chunk_log2, u8 0, k CRC-32s
                of the payload's chunks), then the seal
    b"meta"     b"format_version" -> u32 2, sealed (8 bytes, this framing in every format > 1)
                b"next_version"   -> u64, sealed: above every version ever committed
                b"entry_count"    -> u64, sealed: how many records b"objects" holds

Opening first walks ``data.mdb`` with py-lmdb's pure-Python verifier (``lmdb.verify``, in
tiers.storage's open_lmdb): LMDB 0.9 checksums nothing and trusts its page headers, so damage
there could make it read outside the file and kill the process (SIGBUS). Then every record of
both databases is checked (the catalog loads them all anyway) and the objects are counted
against ``entry_count``, so a record LMDB no longer reaches is caught too. A failed check, or
LMDB reporting a damaged page, raises CorruptionError naming ``data.mdb``; nothing is served
from a damaged catalog. Out of reach: damage that makes LMDB pick its older meta page, which
silently rolls the catalog back one commit. A chunk extension is checked too (format, chunk
size, table length against the size, the table's CRC against the ``crc32`` field). Format 1
(32-byte unsealed entries, a bare u32 stamp, no count) is upgraded in place by the first open,
in the transaction that reads it.

Writes are group-committed (tiers.storage.LmdbWriter): :meth:`Catalog.apply` calls that arrive
while a commit is running go together into the next transaction, so N concurrent puts cost one
fsync, not N. Each caller returns only once the transaction holding its change committed (or
raises if it failed, in which case none of that transaction's changes happened).

Concurrency: loop thread only. Blocking LMDB calls run on the writer's one private thread,
which is also what keeps LMDB's one-writer rule. ``entries`` (the in-memory mirror, for I/O-free
``size_of``/``keys``) changes only in the loop thread, right after a commit succeeds.
``rows`` mirrors it for get_many's compiled planner: each entry without a chunk extension as
40 bytes (file, offset, size, crc32, version: little-endian u64s, read as int64s), so a batch's
table is one ``b"".join`` of dict lookups (tiers.nvme.whole_reads), not five integer objects per
key gathered from scattered tuples (~0.5 us an object at 4 KiB); ~110 bytes of memory an entry.
Invariants: ``entries`` equals the committed ``objects`` database, ``entry_count`` its size and
``used_bytes`` the sum of their sizes; ``rows`` holds exactly the keys of ``entries`` whose
entry has no chunk extension, each as ``pack_row(entry)``; every version handed out by
:meth:`take_version` is unique and above every committed one, across restarts.
"""

from __future__ import annotations

import os
import struct
from typing import Any, NamedTuple

from tiers.io.errors import CorruptionError, EngineClosedError
from tiers.nvme.chunks import extension_problem
from tiers.storage.lmdb_env import LmdbWriter, lmdb_errors, open_lmdb, write_growing
from tiers.storage.lmdb_records import seal, unseal

__all__ = ["ROW_FIELDS", "Catalog", "CatalogEntry", "pack_row"]

CATALOG_FORMAT_VERSION = 2
_ENTRY = struct.Struct("<IQQIQ")
_ROW = struct.Struct("<5Q")  # read as int64: a value past 2**63 turns negative, which no plan takes
ROW_FIELDS = 5  # file, offset, size, crc32, version
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_META = {b"format_version": _U32, b"next_version": _U64, b"entry_count": _U64}
_INITIAL_MAP_BYTES = 1 << 30  # virtual: LMDB's file grows with its contents, not this
_ENV_OPTIONS: dict[str, Any] = {
    "subdir": True,
    "sync": True,
    "metasync": True,
    "max_dbs": 2,
    "readahead": False,
}


class CatalogEntry(NamedTuple):
    """Where a record lies and what it holds; ``chunks``: a chunked record's chunk extension
    (tiers.nvme.chunks), empty for a bare or header record."""

    file_index: int
    offset_bytes: int
    size_bytes: int
    crc32: int
    version: int
    chunks: bytes = b""

    def pack(self) -> bytes:
        return _ENTRY.pack(*self[:5]) + self.chunks

    @classmethod
    def unpack(cls, raw: bytes) -> CatalogEntry:
        if len(raw) == _ENTRY.size:
            return cls(*_ENTRY.unpack(raw))
        file_index, offset_bytes, size_bytes, crc32, version = _ENTRY.unpack_from(raw)
        return cls(file_index, offset_bytes, size_bytes, crc32, version, raw[_ENTRY.size :])


_Change = tuple[str, CatalogEntry | None]


def pack_row(entry: CatalogEntry) -> bytes:
    """``entry``'s row in ``Catalog.rows``: its five base fields as little-endian int64s."""
    return _ROW.pack(*entry[:ROW_FIELDS])


class Catalog:
    """The LMDB catalog of one NvmeTier directory. ``await open()`` before use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data_path = os.path.join(path, "data.mdb")  # what a CorruptionError names
        self.entries: dict[str, CatalogEntry] = {}
        self.rows: dict[str, bytes] = {}  # pack_row of each entry without a chunk extension
        self.used_bytes = 0  # sum of the sizes in ``entries``
        self.next_version = 1
        self.commits = 0  # LMDB transactions committed (group commits count once)
        self._writer: LmdbWriter[_Change] = LmdbWriter(self._commit, "tierkit-catalog")
        self._env: Any = None
        self._objects: Any = None
        self._meta: Any = None

    async def open(self) -> None:
        """Open (creating if needed) the LMDB environment, load and check every entry.

        Raises: CorruptionError (a record fails its check), StorageError.
        """
        await self._writer.call(self._open_sync)

    def take_version(self) -> int:
        """A new version number for a put, unique across restarts once its entry commits."""
        return self.take_versions(1)

    def take_versions(self, count: int) -> int:
        """The first of ``count`` new consecutive version numbers (as ``take_version``)."""
        first = self.next_version
        self.next_version += count
        return first

    async def apply(self, key: str, entry: CatalogEntry | None) -> None:
        """Durably set ``key`` to ``entry`` (None: delete it); returns after the commit.

        Raises: NoSpaceError, StorageError, CorruptionError from LMDB (nothing was changed).
        """
        await self.apply_many([(key, entry)])

    async def apply_many(self, changes: list[tuple[str, CatalogEntry | None]]) -> None:
        """Durably make every change of ``changes`` in one transaction; returns after it.

        Raises as :meth:`apply` (none of the changes happened then).
        """
        if self._env is None:
            raise EngineClosedError(f"catalog {self.path!r} is closed")
        await self._writer.submit(changes)

    async def close(self) -> None:
        """Wait for pending commits, then close LMDB and the worker thread."""
        await self._writer.drain()
        if self._env is not None:
            env, self._env = self._env, None
            await self._writer.call(env.close)
        await self._writer.close()

    # ----------------------------------------------------------------- internals
    async def _commit(self, changes: list[_Change]) -> None:
        """One group commit (loop thread); ``entries`` follows only once it committed."""
        count = self._count_after(changes)
        await self._writer.call(self._commit_sync, changes, self.next_version, count)
        self.commits += 1
        rows = self.rows
        for key, entry in changes:
            old = self.entries.pop(key, None)
            self.used_bytes -= old.size_bytes if old is not None else 0
            rows.pop(key, None)
            if entry is not None:
                self.entries[key] = entry
                self.used_bytes += entry.size_bytes
                if not entry.chunks:
                    rows[key] = pack_row(entry)

    def _count_after(self, changes: list[_Change]) -> int:
        """How many entries the catalog holds once ``changes`` (in order) commit."""
        present = {key: entry is not None for key, entry in changes}
        return len(self.entries) + sum(now - (key in self.entries) for key, now in present.items())

    def _open_sync(self) -> None:
        env = open_lmdb(self.path, map_bytes=_INITIAL_MAP_BYTES, **_ENV_OPTIONS)
        with lmdb_errors(self.data_path):
            try:
                self._load(env)
            except BaseException:
                env.close()
                raise
        self._env = env

    def _load(self, env: Any) -> None:
        with env.begin(write=True) as txn:  # write: stamps a new catalog, upgrades format 1
            self._objects = env.open_db(b"objects", txn=txn)
            self._meta = env.open_db(b"meta", txn=txn)
            names = {bytes(key) for key in txn.cursor().iternext(values=False)}
            if names != {b"objects", b"meta"}:  # a renamed database reads as a new, empty one
                raise self._corrupt(f"catalog databases {sorted(names)}")
            stamp = txn.get(b"format_version", db=self._meta)
            if stamp is None:
                self._stamp_new(txn)
            elif len(stamp) == _U32.size:
                self._upgrade_format_1(txn, _U32.unpack(stamp)[0])
            next_version, count = self._read_meta(txn)
            entries = self._read_entries(txn, count)
        self.entries = entries
        self.rows = {key: pack_row(entry) for key, entry in entries.items() if not entry.chunks}
        self.used_bytes = sum(entry.size_bytes for entry in entries.values())
        versions = (entry.version + 1 for entry in entries.values())
        self.next_version = max(next_version, *versions, 1)

    def _stamp_new(self, txn: Any) -> None:
        if txn.cursor(db=self._objects).first() or txn.cursor(db=self._meta).first():
            raise self._corrupt("catalog records without a format stamp")
        self._put_meta(txn, 1, 0)

    def _upgrade_format_1(self, txn: Any, version: int) -> None:
        if version != 1:
            raise self._corrupt(f"unknown catalog format {version}")
        old = [(bytes(key), bytes(value)) for key, value in txn.cursor(db=self._objects)]
        for key, value in old:
            if len(value) != _ENTRY.size:
                raise self._corrupt(f"catalog entry {key[:64]!r} of {len(value)} bytes")
            txn.put(key, seal(key, value), db=self._objects)
        raw = txn.get(b"next_version", db=self._meta)
        if raw is not None and len(raw) != _U64.size:
            raise self._corrupt(f"next_version of {len(raw)} bytes")
        self._put_meta(txn, _U64.unpack(raw)[0] if raw is not None else 1, len(old))

    def _read_meta(self, txn: Any) -> tuple[int, int]:
        """(next_version, entry_count) from the checked ``meta`` records."""
        path = self.data_path
        bodies = {bytes(k): unseal(bytes(k), bytes(v), path) for k, v in txn.cursor(db=self._meta)}
        stamp = bodies.get(b"format_version", b"")
        version = _U32.unpack(stamp)[0] if len(stamp) == _U32.size else None
        if version != CATALOG_FORMAT_VERSION:
            raise self._corrupt(f"unknown catalog format {version}")
        sizes = {key: len(body) for key, body in bodies.items()}
        if sizes != {key: layout.size for key, layout in _META.items()}:
            raise self._corrupt(f"catalog meta records {sorted(bodies)} are not {sorted(_META)}")
        return _U64.unpack(bodies[b"next_version"])[0], _U64.unpack(bodies[b"entry_count"])[0]

    def _read_entries(self, txn: Any, count: int) -> dict[str, CatalogEntry]:
        entries = {}
        for raw_key, value in txn.cursor(db=self._objects):
            key = bytes(raw_key)
            body = unseal(key, bytes(value), self.data_path)
            if len(body) < _ENTRY.size:
                raise self._corrupt(f"catalog entry {key[:64]!r} of {len(body)} bytes")
            entry = CatalogEntry.unpack(body)
            if entry.chunks:
                problem = extension_problem(entry.chunks, entry.size_bytes, entry.crc32)
                if problem is not None:
                    raise self._corrupt(f"catalog entry {key[:64]!r}: {problem}")
            try:
                entries[key.decode()] = entry
            except UnicodeDecodeError:  # sealed so: written by something else than a Catalog
                raise self._corrupt(f"catalog key {key[:64]!r} is not UTF-8") from None
        if len(entries) != count:  # LMDB lost a record, or holds one it was never given
            raise self._corrupt(f"catalog holds {len(entries)} entries, its count says {count}")
        return entries

    def _put_meta(self, txn: Any, next_version: int, entry_count: int) -> None:
        for key, body in (
            (b"format_version", _U32.pack(CATALOG_FORMAT_VERSION)),
            (b"next_version", _U64.pack(next_version)),
            (b"entry_count", _U64.pack(entry_count)),
        ):
            txn.put(key, seal(key, body), db=self._meta)

    def _corrupt(self, what: str) -> CorruptionError:
        return CorruptionError(f"{what} in {self.data_path}", self.data_path)

    def _commit_sync(self, changes: list[_Change], next_version: int, entry_count: int) -> None:
        def write(txn: Any) -> None:
            for key, entry in changes:
                raw = key.encode()
                if entry is None:
                    txn.delete(raw, db=self._objects)
                else:
                    txn.put(raw, seal(raw, entry.pack()), db=self._objects)
            self._put_meta(txn, next_version, entry_count)

        with lmdb_errors(self.data_path):
            write_growing(self._env, write)
