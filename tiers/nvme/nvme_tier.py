"""NvmeTier: the persistent tier, objects as checksummed records in extent files that grow.

Layout of ``directory``::

    LOCK                  flock()ed by the one process that has the tier open
    FORMAT                the tier format marker (tiers.nvme.format, tiers.nvme.marker)
    catalog/              LMDB: key -> (file, offset, size, crc32, version[, chunk CRCs])
    extents-00000.dat ... extent files of records, grown as they fill       (tiers.nvme.space)

A record (tiers.nvme.format) is a whole number of 4 KiB pages: an object of 1 MiB or more is
stored chunked (payload and padding; a CRC-32 per 256 KiB chunk in its catalog entry, so a byte
range is read and checked alone: tiers.nvme.chunks), a smaller one of whole pages bare (its
identity and CRC-32 only in the catalog entry, so 4 KiB takes 4 KiB), any other as a 64-byte
header, the payload and padding. Every byte moves through the I/O engine with
O_DIRECT (unless ``direct=False``), staged in the runtime's shared aligned buffers. Opening takes
no disk space: extent files are fallocated in steps as records need room (ExtentSpace), so a
tier's capacity may exceed the free space of its filesystem, and its files may grow past
``capacity_bytes`` by record padding, fragmentation and overwrites in progress (old and new
record coexist until the commit).

Machinery comes from an IORuntime (``runtime=``; default: the process's): the engine of the
caller's loop, leased at ``start`` and released at ``aclose``; staging buffers from
``runtime.buffers``; blocking calls (directory fsyncs, the marker) on ``runtime.run_blocking``;
checksums and copies of large payloads on ``runtime.run_cpu``.

Crash consistency, by the order of a put (tiers.nvme.writes): allocate a free extent -> write
the record -> fdatasync the extent file (shared by concurrent puts: GroupSync) -> commit the
catalog entry (an fsynced LMDB transaction, group-committed) -> only then free the key's
previous extent. A put is acknowledged after the commit. A crash before the commit leaves the
old entry, pointing at the old record, untouched; after it, the new record is already durable. A
delete commits the removal, then frees. So the catalog only ever names durable records, and a
reopened tier finds every acknowledged object. A get re-checks the record against its catalog
entry (size, version, CRC-32 of the payload; key hash and header CRC for a header record) and
raises CorruptionError rather than return a wrong byte (a byte-range get reads and checks the
chunks that cover it, of a record that has none the whole payload). Reads (tiers.nvme.reads):
``get_many`` reads all its records in one engine submission, and concurrent single gets are
gathered into one; ``put_many`` writes in one submission and shares one durability point.

Concurrency: one asyncio loop. Puts and deletes of one key are serialised by a per-key lock;
everything else interleaves; a get returns the old or the new object, whole (see reads). Puts
and deletes run as tasks shielded from the caller's cancellation: once begun they either commit
or undo, so a cancelled caller cannot leak an extent or leave catalog and extents disagreeing.
Invariants: ``used_bytes`` (sum of committed sizes) + bytes reserved by puts in flight <=
``capacity_bytes`` (reopening with a smaller capacity than the objects found is allowed: puts
then fail until enough is deleted); a failed put (CapacityError, NoSpaceError, EIO, ...) changes
nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import Any

from tiers.io.engine import IOEngine
from tiers.io.env import default_env
from tiers.io.errors import (
    EngineClosedError,
    FileMissingError,
    InvalidArgumentError,
)
from tiers.io.runtime import IORuntime, default_runtime
from tiers.nvme.catalog import Catalog
from tiers.nvme.format import RECORD_ALIGNMENT_BYTES
from tiers.nvme.group_sync import GroupSync
from tiers.nvme.marker import load_marker
from tiers.nvme.put_gather import PutGather
from tiers.nvme.reads import NvmeReads
from tiers.nvme.records import RecordIO
from tiers.nvme.space import ExtentSpace, default_file_bytes, extent_file_name
from tiers.nvme.writes import KeyLocks, NvmeWrites
from tiers.storage.directory import fsync_directory, lock_directory, unlock_directory
from tiers.storage.op_guard import OpGuard
from tiers.storage.tier import Tier

__all__ = ["NvmeTier"]

# "0": every single get is gathered (tiers.nvme.reads), bare records too; read at each start
SINGLE_GETS_ENV = "TIERKIT_NVME_SINGLE_GETS"


class NvmeTier(NvmeReads, NvmeWrites, Tier):
    """The NVMe tier. Use ``await NvmeTier.open(...)`` (or construct, then ``await start()``).

    Args:
        directory: holds the catalog and extent files.
        create: make a new tier when ``directory`` holds none (creating the directory too);
            False (the default) raises FileMissingError instead, so a mistyped path is an
            error, not a new, empty tier that makes the user's data look lost.
        runtime: the IORuntime whose engine (of the loop that starts the tier), buffers and
            executors the tier uses; default: ``default_runtime()``.
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
        runtime: IORuntime | None = None,
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
        self.runtime = runtime
        self.engine: IOEngine | None = None  # leased from the runtime by start()
        self._catalog: Catalog | None = None
        self._space: ExtentSpace | None = None
        self._records: RecordIO | None = None
        self._syncs: GroupSync | None = None
        self._lock_fd: int | None = None
        self._state = "new"  # new -> starting -> open -> closing -> closed
        self._damaged: set[str] = set()  # keys whose catalog entry names impossible space
        self._reserved_bytes = 0  # charged to puts in flight, not yet committed
        self._bare_from = 1  # entries of this version and above may be bare (the marker)
        self._ops = OpGuard()
        self._key_locks = KeyLocks()
        self._put_gather = PutGather(self._put_items, self._ops)
        self.counters = dict.fromkeys(("gets", "hits", "misses", "puts", "deletes"), 0)
        self.counters["corruptions"] = 0
        self.counters["fdatasyncs"] = 0

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
        open), CorruptionError (a damaged catalog or format marker), DirectIOUnsupportedError.
        """
        if self._state != "new":
            raise InvalidArgumentError(f"tier {self.name!r} was already started")
        self._state = "starting"
        runtime = self.runtime = self.runtime or default_runtime()
        catalog_path = os.path.join(self.directory, "catalog")
        data_path = os.path.join(catalog_path, "data.mdb")
        exists = await runtime.run_blocking(os.path.isfile, data_path)
        if not self.create and not exists:
            self._state = "closed"
            raise FileMissingError(
                errno.ENOENT,
                f"no NVMe tier in {self.directory!r} (no catalog); check the path, or pass "
                "create=True (config: create = true) to make a new tier there",
                self.directory,
            )
        try:
            engine = self.engine = runtime.acquire_engine()
            env = engine.env
            self._lock_fd = lock_directory(self.directory, env)
            self._records = RecordIO(engine, runtime.buffers, runtime.run_cpu)
            self._singles_engine = engine.gathers_singles and (
                os.environ.get(SINGLE_GETS_ENV, "1") != "0"
            )
            self._syncs = GroupSync(engine)
            self._catalog = Catalog(catalog_path)
            await self._catalog.open()
            next_version = self._catalog.next_version
            self._bare_from = await runtime.run_blocking(
                load_marker, env, self.directory, next_version
            )
            # LMDB fsyncs its files, not their names: make catalog/ and its files findable.
            for path in (catalog_path, self.directory):
                await runtime.run_blocking(fsync_directory, env, path)
            self._space = ExtentSpace(
                engine, self.directory, self.extent_file_bytes, self.direct, self.capacity_bytes
            )
            used = (
                (key, e.file_index, e.offset_bytes, self._entry_bytes(e))
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
        out["bare_from_version"] = self._bare_from
        if self._records is not None:
            out["bytes_read"] = self._records.bytes_read
            out["bytes_written"] = self._records.bytes_written
        if self._syncs is not None:
            out["fdatasyncs"] = self._syncs.syncs
            out["fdatasync_waits"] = self._syncs.waits
        if self._catalog is not None:
            out["catalog_commits"] = self._catalog.commits
        if self._space is not None:
            out.update(self._space.stats())
        if self.engine is not None:
            out["engine"] = self.engine.name
        return out

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
        engine, self.engine = self.engine, None
        if self._lock_fd is not None:
            unlock_directory(self._lock_fd, engine.env if engine else default_env)
            self._lock_fd = None
        if engine is not None and self.runtime is not None:
            with contextlib.suppress(EngineClosedError):
                await self.runtime.release_engine(engine)


def _round_up(size_bytes: int) -> int:
    unit = RECORD_ALIGNMENT_BYTES
    return max(unit, -(-size_bytes // unit) * unit)
