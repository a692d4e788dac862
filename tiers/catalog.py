"""Catalog: the durable map from key to where its object record lives, kept in LMDB.

On disk, ``<tier dir>/catalog/`` is one LMDB environment (``data.mdb``, ``lock.mdb``) opened with
``sync=True, metasync=True``, so a transaction is on stable storage when its commit returns. It
holds two named databases:

::

    b"objects"  key: the object key, UTF-8 (1..511 bytes, LMDB's key limit)
                value: 32 bytes, little-endian struct "<IQQIQ":
                  file_index u32    extent file "extents-<file_index:05d>.dat"
                  offset_bytes u64  where the record starts in that file (4 KiB aligned)
                  size_bytes u64    payload size
                  crc32 u32         zlib.crc32 of the payload (also in the record header)
                  version u64       the put's version (also in the record header)
    b"meta"     b"format_version" -> u32, 1
                b"next_version"   -> u64, above every version ever committed

Writes are group-committed: :meth:`Catalog.apply` calls that arrive while a commit is running
go together into the next transaction, so N concurrent puts cost one fsync, not N. Each caller
returns only once the transaction holding its change committed (or raises if it failed, in which
case none of that transaction's changes happened).

Concurrency: loop thread only. Blocking LMDB calls run on one private worker thread, which is
also what keeps LMDB's one-writer rule. ``entries`` (the in-memory mirror, for I/O-free
``size_of``/``keys``) changes only in the loop thread, right after a commit succeeds.
Invariants: ``entries`` equals the committed ``objects`` database and ``used_bytes`` is the sum
of their sizes; every version handed out by
:meth:`take_version` is unique and above every committed one, across restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import lmdb

from tiers.errors import (
    CorruptionError,
    EngineClosedError,
    NoSpaceError,
    PermissionDeniedError,
    StorageError,
    map_os_errors,
)

__all__ = ["Catalog", "CatalogEntry", "lmdb_errors"]

CATALOG_FORMAT_VERSION = 1
_ENTRY = struct.Struct("<IQQIQ")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INITIAL_MAP_BYTES = 1 << 30  # virtual: LMDB's file grows with its contents, not this


class CatalogEntry(NamedTuple):
    file_index: int
    offset_bytes: int
    size_bytes: int
    crc32: int
    version: int

    def pack(self) -> bytes:
        return _ENTRY.pack(*self)

    @classmethod
    def unpack(cls, raw: bytes) -> CatalogEntry:
        return cls(*_ENTRY.unpack(raw))


_Change = tuple[str, CatalogEntry | None, "asyncio.Future[None]"]


class Catalog:
    """The LMDB catalog of one NvmeTier directory. ``await open()`` before use."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.entries: dict[str, CatalogEntry] = {}
        self.used_bytes = 0  # sum of the sizes in ``entries``
        self.next_version = 1
        self.commits = 0  # LMDB transactions committed (group commits count once)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="tierkit-catalog")
        self._env: Any = None
        self._objects: Any = None
        self._meta: Any = None
        self._pending: list[_Change] = []
        self._committer: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Open (creating if needed) the LMDB environment and load every entry."""
        await self._call(self._open_sync)

    def take_version(self) -> int:
        """A new version number for a put, unique across restarts once its entry commits."""
        version = self.next_version
        self.next_version += 1
        return version

    async def apply(self, key: str, entry: CatalogEntry | None) -> None:
        """Durably set ``key`` to ``entry`` (None: delete it); returns after the commit.

        Raises: NoSpaceError, StorageError, CorruptionError from LMDB (nothing was changed).
        """
        if self._env is None:
            raise EngineClosedError(f"catalog {self.path!r} is closed")
        future = asyncio.get_running_loop().create_future()
        self._pending.append((key, entry, future))
        if self._committer is None or self._committer.done():
            self._committer = asyncio.ensure_future(self._commit_loop())
        await future

    async def close(self) -> None:
        """Wait for pending commits, then close LMDB and the worker thread."""
        while self._committer is not None and not self._committer.done():
            await asyncio.shield(self._committer)
        if self._env is not None:
            env, self._env = self._env, None
            await self._call(env.close)
        self._executor.shutdown(wait=False)

    # ----------------------------------------------------------------- internals
    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _commit_loop(self) -> None:
        while self._pending:
            batch, self._pending = self._pending, []
            changes = [(key, entry) for key, entry, _ in batch]
            try:
                await self._call(self._commit_sync, changes, self.next_version)
            except Exception as exc:
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.commits += 1
            for key, entry in changes:
                old = self.entries.pop(key, None)
                self.used_bytes -= old.size_bytes if old is not None else 0
                if entry is not None:
                    self.entries[key] = entry
                    self.used_bytes += entry.size_bytes
            for _, _, future in batch:
                if not future.done():
                    future.set_result(None)

    def _open_sync(self) -> None:
        with lmdb_errors(self.path):
            with map_os_errors(self.path):
                env = lmdb.open(
                    self.path,
                    map_size=_INITIAL_MAP_BYTES,
                    subdir=True,
                    sync=True,
                    metasync=True,
                    max_dbs=2,
                    readahead=False,
                )
            try:
                self._objects = env.open_db(b"objects")
                self._meta = env.open_db(b"meta")
                self._load(env)
            except BaseException:
                env.close()
                raise
        self._env = env

    def _load(self, env: Any) -> None:
        with env.begin(write=True) as txn:  # write: a fresh catalog gets its format stamp
            fmt = txn.get(b"format_version", db=self._meta)
            if fmt is None:
                txn.put(b"format_version", _U32.pack(CATALOG_FORMAT_VERSION), db=self._meta)
            elif _U32.unpack(fmt)[0] != CATALOG_FORMAT_VERSION:
                raise CorruptionError(f"unknown catalog format {_U32.unpack(fmt)[0]}", self.path)
            raw = txn.get(b"next_version", db=self._meta)
            next_version = _U64.unpack(raw)[0] if raw is not None else 1
            entries: dict[str, CatalogEntry] = {}
            for key, value in txn.cursor(db=self._objects):
                if len(value) != _ENTRY.size:
                    raise CorruptionError(f"catalog entry of {len(value)} bytes", self.path)
                entry = CatalogEntry.unpack(value)
                entries[bytes(key).decode()] = entry
                next_version = max(next_version, entry.version + 1)
        self.entries = entries
        self.used_bytes = sum(entry.size_bytes for entry in entries.values())
        self.next_version = next_version

    def _commit_sync(self, changes: list[tuple[str, CatalogEntry | None]], next_version: int):
        with lmdb_errors(self.path):
            while True:
                try:
                    with self._env.begin(write=True) as txn:
                        for key, entry in changes:
                            if entry is None:
                                txn.delete(key.encode(), db=self._objects)
                            else:
                                txn.put(key.encode(), entry.pack(), db=self._objects)
                        txn.put(b"next_version", _U64.pack(next_version), db=self._meta)
                    return
                except lmdb.MapFullError:  # the map is virtual: double it and retry
                    self._env.set_mapsize(self._env.info()["map_size"] * 2)


@contextlib.contextmanager
def lmdb_errors(path: str) -> Iterator[None]:
    """Translate LMDB's exceptions into the tierkit error tree."""
    try:
        yield
    except lmdb.Error as exc:
        message = f"LMDB: {exc}"
        if isinstance(exc, lmdb.DiskError):
            raise NoSpaceError(errno.ENOSPC, message, path) from exc
        if isinstance(exc, lmdb.ReadonlyError):
            raise PermissionDeniedError(errno.EROFS, message, path) from exc
        corrupt = (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError)
        if isinstance(exc, corrupt) or type(exc).__name__ == "BadChecksumError":
            raise CorruptionError(message, path) from exc
        raise StorageError(errno.EIO, message, path) from exc
