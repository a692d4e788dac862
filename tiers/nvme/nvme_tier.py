"""NvmeTier: the persistent tier, objects as checksummed records in extent files that grow.

Layout of ``directory``::

    LOCK                  flock()ed by the one process that has the tier open
    catalog/              LMDB: key -> (file, offset, size, crc32, version)  (tiers.nvme.catalog)
    extents-00000.dat ... extent files of records, grown as they fill       (tiers.nvme.space)

A record (tiers.nvme.format) is a 64-byte header, the payload and padding to 4 KiB; every byte
moves through the I/O engine with O_DIRECT (unless ``direct=False``), staged in reusable aligned
bounce buffers. Opening takes no disk space: extent files are fallocated in steps as records
need room (ExtentSpace), so a tier's capacity may exceed the free space of its filesystem, and
its files may grow past ``capacity_bytes`` by record padding, fragmentation and overwrites in
progress (old and new record coexist until the commit).

Crash consistency, by the order of a put: allocate a free extent -> write the record (one
O_DIRECT write) -> fdatasync the extent file -> commit the catalog entry (an fsynced LMDB
transaction) -> only then free the key's previous extent. A put is acknowledged after the
commit. A crash before the commit leaves the old entry, pointing at the old record, untouched;
after it, the new record is already durable. A delete commits the removal, then frees. So the
catalog only ever names durable records, and a reopened tier finds every acknowledged object.
A get re-checks the record against its catalog entry (key hash, size, version, CRC-32 of the
payload, header CRC) and raises CorruptionError rather than return a wrong byte.

A byte-range get still reads and checks the whole record: the checksum covers the whole payload.

Concurrency: one asyncio loop. Puts and deletes of one key are serialised by a per-key lock;
everything else interleaves. A get reads the extent named by the catalog when it starts and pins
it, so an overwrite or delete that commits meanwhile defers freeing it until the read ends: a get
returns the old or the new object, whole. Puts and deletes run as tasks shielded from the
caller's cancellation: once begun they either commit or undo, so a cancelled caller cannot leak
an extent or leave the catalog and the extents disagreeing.
Invariants: ``used_bytes`` (sum of committed sizes) + bytes reserved by puts in flight <=
``capacity_bytes`` (reopening with a smaller capacity than the objects found is allowed: puts
then fail until enough is deleted); a failed put (CapacityError, NoSpaceError, EIO, ...) changes
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from tiers.io.buffers import as_buffer
from tiers.io.byte_views import is_tensor
from tiers.io.engine import IOEngine
from tiers.io.env import default_env
from tiers.io.errors import (
    CapacityError,
    CorruptionError,
    EngineClosedError,
    FileMissingError,
    InvalidArgumentError,
)
from tiers.nvme.catalog import Catalog, CatalogEntry
from tiers.nvme.format import RECORD_ALIGNMENT_BYTES, key_hash, record_bytes
from tiers.nvme.records import RecordIO, writable_view
from tiers.nvme.space import ExtentSpace, default_file_bytes, extent_file_name
from tiers.storage.directory import fsync_directory, lock_directory, unlock_directory
from tiers.storage.op_guard import OpGuard
from tiers.storage.tier import ByteRange, Tier, check_key, resolve_range

__all__ = ["NvmeTier"]


class NvmeTier(Tier):
    """The NVMe tier. Use ``await NvmeTier.open(...)`` (or construct, then ``await start()``).

    Args:
        directory: holds the catalog and extent files.
        create: make a new tier when ``directory`` holds none (creating the directory too);
            False (the default) raises FileMissingError instead, so a mistyped path is an
            error, not a new, empty tier that makes the user's data look lost.
        engine: the I/O engine to use (the caller keeps owning it); default: ``create_engine()``,
            owned and closed by the tier.
        extent_file_bytes: size an extent file grows to before the next one starts (capped to
            the capacity); files grow in steps of at most 64 MiB. Default: 256 MiB, or more for
            a tier above 64 GiB, so that a full tier has about 256 files open.
        direct: O_DIRECT I/O; where the filesystem refuses it, ``start`` raises
            DirectIOUnsupportedError unless this is False.
    """

    kind = "nvme"
    supports_persistence = True
    read_latency_s = 100e-6
    read_bandwidth_bytes_per_s = 1.5e9

    def __init__(
        self,
        name: str,
        capacity_bytes: int,
        directory: str | os.PathLike[str],
        *,
        engine: IOEngine | None = None,
        owns_engine: bool | None = None,
        extent_file_bytes: int | None = None,
        direct: bool = True,
        create: bool = False,
    ) -> None:
        super().__init__(name, capacity_bytes)
        if extent_file_bytes is None:
            extent_file_bytes = default_file_bytes(capacity_bytes)
        if not isinstance(extent_file_bytes, int) or extent_file_bytes <= 0:
            raise InvalidArgumentError(f"extent_file_bytes must be positive: {extent_file_bytes!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.direct = direct
        self.create = create
        self.extent_file_bytes = _round_up(min(extent_file_bytes, capacity_bytes))
        self.engine = engine
        # None: the tier closes the engine only when it made it
        self._owns_engine = engine is None if owns_engine is None else owns_engine
        self._catalog: Catalog | None = None
        self._space: ExtentSpace | None = None
        self._records: RecordIO | None = None
        self._lock_fd: int | None = None
        self._state = "new"  # new -> starting -> open -> closing -> closed
        self._damaged: set[str] = set()  # keys whose catalog entry names impossible space
        self._reserved_bytes = 0  # charged to puts in flight, not yet committed
        self._ops = OpGuard()
        self.counters = dict.fromkeys(("gets", "hits", "misses", "puts", "deletes"), 0)
        self.counters["corruptions"] = 0

    @classmethod
    async def open(
        cls, name: str, capacity_bytes: int, directory: str | os.PathLike[str], **options: Any
    ) -> NvmeTier:
        """Construct and :meth:`start` a tier."""
        tier = cls(name, capacity_bytes, directory, **options)
        await tier.start()
        return tier

    async def start(self) -> None:
        """Reopen the tier in the directory (or, with ``create``, make one): lock it, load the
        catalog, open the extent files and rebuild the free space from the catalog (no space is
        preallocated).

        Raises: FileMissingError (no tier there and not ``create``), PermissionDeniedError /
        InvalidArgumentError (directory unusable), StorageError (EBUSY: another tier has it
        open), DirectIOUnsupportedError.
        """
        if self._state != "new":
            raise InvalidArgumentError(f"tier {self.name!r} was already started")
        self._state = "starting"
        catalog_path = os.path.join(self.directory, "catalog")
        exists = await asyncio.to_thread(os.path.isfile, os.path.join(catalog_path, "data.mdb"))
        if not self.create and not exists:
            self._state = "closed"
            raise FileMissingError(
                errno.ENOENT,
                f"no NVMe tier in {self.directory!r} (no catalog); check the path, or pass "
                "create=True (config: create = true) to make a new tier there",
                self.directory,
            )
        try:
            if self.engine is None:
                from tiers.io.factory import create_engine

                self.engine = create_engine()
            self._lock_fd = lock_directory(self.directory, self.engine.env)
            self._records = RecordIO(self.engine)
            self._catalog = Catalog(catalog_path)
            await self._catalog.open()
            # LMDB fsyncs its files, not their names: make catalog/ and its files findable.
            for path in (catalog_path, self.directory):
                await asyncio.to_thread(fsync_directory, self.engine.env, path)
            self._space = ExtentSpace(
                self.engine, self.directory, self.extent_file_bytes, self.direct
            )
            used = (
                (key, e.file_index, e.offset_bytes, record_bytes(e.size_bytes))
                for key, e in self._catalog.entries.items()
            )
            self._damaged = await self._space.open(used)
        except BaseException:
            await self._release_resources()
            self._state = "closed"
            raise
        self._state = "open"

    # ----------------------------------------------------------------- Tier API
    @property
    def used_bytes(self) -> int:
        return self._catalog.used_bytes if self._catalog is not None else 0

    def size_of(self, key: str) -> int | None:
        entry = self._open_catalog().entries.get(key)
        return None if entry is None else entry.size_bytes

    def keys(self, prefix: str = "") -> Iterator[str]:
        return iter([key for key in self._open_catalog().entries if key.startswith(prefix)])

    def locate(self, key: str) -> tuple[str, int] | None:
        """(extent file path, file offset) of the key's record, or None when absent (no I/O)."""
        entry = self._open_catalog().entries.get(key)
        if entry is None:
            return None
        return self._file_path(entry.file_index), entry.offset_bytes

    async def get(
        self, key: str, *, into: Any = None, byte_range: ByteRange | None = None
    ) -> Any | None:
        check_key(key)
        catalog, space, records = self._open_catalog(), self._space, self._records
        assert space is not None and records is not None
        self.counters["gets"] += 1
        entry = catalog.entries.get(key)
        if entry is None:
            self.counters["misses"] += 1
            return None
        offset, size = resolve_range(entry.size_bytes, byte_range)
        out = None if into is None else writable_view(into, size)
        if key in self._damaged:
            self.counters["corruptions"] += 1
            raise CorruptionError(
                f"catalog entry of {key!r} names space past its extent file or another's",
                self._file_path(entry.file_index),
                entry.offset_bytes,
            )
        address = space.address_of(entry.file_index, entry.offset_bytes)
        space.pin(address)  # no await since the lookup: the extent is still this entry's
        try:
            with self._ops.track():
                file, file_offset = space.locate(address)
                result = await records.read(
                    file, file_offset, entry, key_hash(key), offset, size, out
                )
        except CorruptionError:
            self.counters["corruptions"] += 1
            raise
        finally:
            space.unpin(address)
        self.counters["hits"] += 1
        return result if into is None else into

    async def put(self, key: str, data: Any) -> None:
        check_key(key)
        self._open_catalog()
        device = getattr(data, "device", None)
        if is_tensor(data) and getattr(device, "type", "cpu") != "cpu":
            data = data.detach().cpu()  # the host engine stages through host memory
        ref = as_buffer(data)
        payload = np.frombuffer(ref.memoryview(), np.uint8) if ref.size_bytes else _EMPTY
        await self._ops.shielded(self._put(key, payload, ref))

    async def delete(self, key: str) -> bool:
        check_key(key)
        self._open_catalog()
        return await self._ops.shielded(self._delete(key))

    async def aclose(self) -> None:
        """Refuse new calls, let those in flight finish, then close catalog, files, engine."""
        if self._state in ("closed", "closing"):
            return
        self._state = "closing"
        await self._ops.drain()
        await self._release_resources()
        self._state = "closed"

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out.update(self.counters)
        out["reserved_bytes"] = self._reserved_bytes
        out["damaged_entries"] = len(self._damaged)
        if self._records is not None:
            out["bytes_read"] = self._records.bytes_read
            out["bytes_written"] = self._records.bytes_written
            out["bounce_buffer_hits"] = self._records.buffers.hits
        if self._catalog is not None:
            out["catalog_commits"] = self._catalog.commits
        if self._space is not None:
            out.update(self._space.stats())
        if self.engine is not None:
            out["engine"] = self.engine.name
        return out

    # ----------------------------------------------------------------- put / delete
    async def _put(self, key: str, payload: np.ndarray, owner: Any) -> None:
        catalog, space = self._catalog, self._space
        assert catalog is not None and space is not None
        size = payload.nbytes
        async with self._ops.key(key):
            old = catalog.entries.get(key)
            old_damaged = key in self._damaged
            reserve = max(0, size - (old.size_bytes if old is not None else 0))
            if catalog.used_bytes + self._reserved_bytes + reserve > self.capacity_bytes:
                raise CapacityError(
                    f"tier {self.name!r}: {size} bytes for {key!r} do not fit: "
                    f"{catalog.used_bytes} used + {self._reserved_bytes} reserved of "
                    f"{self.capacity_bytes}"
                )
            self._reserved_bytes += reserve
            try:
                await self._write_and_commit(key, payload, catalog, space)
            finally:
                self._reserved_bytes -= reserve
            del owner  # the payload has been copied into the record
            self._damaged.discard(key)
            if old is not None and not old_damaged:
                space.release(
                    space.address_of(old.file_index, old.offset_bytes),
                    record_bytes(old.size_bytes),
                )
            self.counters["puts"] += 1

    async def _write_and_commit(
        self, key: str, payload: np.ndarray, catalog: Catalog, space: ExtentSpace
    ) -> None:
        """Steps 1-4 of a put: allocate, write, fdatasync, commit. On any failure the extent
        goes back to the free space and the catalog is as it was."""
        assert self._records is not None
        total = record_bytes(payload.nbytes)
        address = await space.allocate(total)
        committed = False
        try:
            file_index, file_offset = space.split(address)
            version = catalog.take_version()
            file = space.files[file_index]
            crc = await self._records.write(file, file_offset, payload, version, key_hash(key))
            entry = CatalogEntry(file_index, file_offset, payload.nbytes, crc, version)
            await catalog.apply(key, entry)  # the record is durable: now the catalog names it
            committed = True
        finally:
            if not committed:
                space.release(address, total)  # never named by the catalog: free at once

    async def _delete(self, key: str) -> bool:
        catalog, space = self._catalog, self._space
        assert catalog is not None and space is not None
        async with self._ops.key(key):
            old = catalog.entries.get(key)
            if old is None:
                return False
            await catalog.apply(key, None)
            if key not in self._damaged:
                address = space.address_of(old.file_index, old.offset_bytes)
                space.release(address, record_bytes(old.size_bytes))
            self._damaged.discard(key)
            self.counters["deletes"] += 1
            return True

    # ----------------------------------------------------------------- helpers
    def _file_path(self, file_index: int) -> str:
        return os.path.join(self.directory, extent_file_name(file_index))

    def _open_catalog(self) -> Catalog:
        if self._state != "open" or self._catalog is None:
            raise EngineClosedError(f"tier {self.name!r} is {self._state}, not open")
        return self._catalog

    async def _release_resources(self) -> None:
        if self._catalog is not None:
            await self._catalog.close()
        if self._space is not None:
            await self._space.close()
        if self._owns_engine and self.engine is not None:
            with contextlib.suppress(EngineClosedError):
                await self.engine.aclose()
        if self._records is not None:
            self._records.buffers.clear()
        if self._lock_fd is not None:
            unlock_directory(self._lock_fd, self.engine.env if self.engine else default_env)
            self._lock_fd = None


_EMPTY = np.empty(0, np.uint8)


def _round_up(size_bytes: int) -> int:
    unit = RECORD_ALIGNMENT_BYTES
    return max(unit, -(-size_bytes // unit) * unit)
