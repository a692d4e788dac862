"""ExtentSpace: the extent files of an NvmeTier, seen as one space of reusable 4 KiB extents.

Files are ``<dir>/extents-<index:05d>.dat``. Space is taken from the filesystem as records need
it, never ahead: the last file grows by ``posix_fallocate`` in steps of ``grow_bytes`` (at most
64 MiB) up to ``file_bytes``, then a new file starts; a record larger than ``file_bytes`` gets a
file of its own size. A tier of any capacity therefore costs no disk at open, and its files hold
about what its records hold. Before any extent of new space is handed out, the file's new size
is fsynced (and a new file's directory entry too), so a catalog entry never points into space
that a crash could take away. The files hold nothing but records (see tiers.nvme.format); which
extent holds what is known only to the catalog. The capacity is not enforced here (NvmeTier
charges puts against it); space grows only when no free extent fits.

Addressing: file ``i`` occupies addresses ``[i * FILE_STRIDE_BYTES, i * FILE_STRIDE_BYTES +
size_i)`` of one ExtentAllocator. The rest of each stride is never free, so no extent straddles
two files, while holes in every file are found by one segregated-fit lookup (lowest address
first, which keeps the early files full and the late ones empty). The allocator starts with
nothing free; opening frees the parts of each file no record holds, and growing frees the new
part (which merges with a free tail of the file).

Pins: a read pins the extent it reads; releasing a pinned extent (an overwrite or delete that
committed meanwhile) is deferred to the last unpin, so an extent is never rewritten while a read
of it is in flight.

Concurrency: loop thread only. Growing the files is serialised by one asyncio lock; blocking
calls (fallocate, directory fsync) run in worker threads through the engine's Env. Growing the
last file runs beside writes of records into its older part: they touch disjoint ranges.
Invariants: every address the allocator has free lies inside a preallocated, durable part of a
file; an extent is either free, or held by exactly one record (committed or being written), or
pinned and waiting for its deferred free.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterable
from typing import Any

from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import EngineClosedError, InvalidArgumentError, StorageError, map_os_errors
from tiers.nvme.format import RECORD_ALIGNMENT_BYTES
from tiers.storage.directory import fsync_directory
from tiers.storage.extents import ExtentAllocator

__all__ = [
    "FILE_STRIDE_BYTES",
    "GROW_STEP_BYTES",
    "MAX_EXTENT_FILES",
    "ExtentSpace",
    "default_file_bytes",
    "extent_file_name",
]

FILE_STRIDE_BYTES = 1 << 40  # address span per file: also the largest extent file
MAX_EXTENT_FILES = 1 << 16
# Space taken per growth: one fallocate + fsync per 64 MiB written is noise next to the writes,
# and a tier holds at most this much more disk than its records need.
GROW_STEP_BYTES = 64 << 20
_DEFAULT_FILE_BYTES = 256 << 20
_DEFAULT_FILES = 256  # a full tier's files by default: each holds a descriptor while open
_FILE_NAME = re.compile(r"^extents-(\d{5,})\.dat$")


def default_file_bytes(capacity_bytes: int) -> int:
    """The extent file size of a tier that asks for none: 256 MiB, or more, so that a full tier
    needs about 256 files. Files grow as they fill, so a large one costs nothing up front."""
    wanted = -(-capacity_bytes // _DEFAULT_FILES)
    wanted = -(-wanted // RECORD_ALIGNMENT_BYTES) * RECORD_ALIGNMENT_BYTES
    return min(max(_DEFAULT_FILE_BYTES, wanted), FILE_STRIDE_BYTES - RECORD_ALIGNMENT_BYTES)


def extent_file_name(index: int) -> str:
    return f"extents-{index:05d}.dat"


class ExtentSpace:
    """Extent files under ``directory``, each growing to ``file_bytes`` (or one record)."""

    def __init__(self, engine: IOEngine, directory: str, file_bytes: int, direct: bool) -> None:
        if file_bytes % RECORD_ALIGNMENT_BYTES or not 0 < file_bytes < FILE_STRIDE_BYTES:
            raise InvalidArgumentError(
                f"extent files must be a positive multiple of 4 KiB below 1 TiB: {file_bytes}"
            )
        self.engine = engine
        self.directory = directory
        self.file_bytes = file_bytes
        self.grow_bytes = min(file_bytes, GROW_STEP_BYTES)
        self.direct = direct
        self.files: dict[int, FileHandle] = {}
        self.sizes: dict[int, int] = {}  # usable bytes of each file (a multiple of 4 KiB)
        arena = MAX_EXTENT_FILES * FILE_STRIDE_BYTES
        self._allocator = ExtentAllocator(arena, RECORD_ALIGNMENT_BYTES, all_free=False)
        self._pins: dict[int, int] = {}  # address -> reads in flight
        self._deferred: dict[int, int] = {}  # address -> size, freed at the last unpin
        self._grow_lock = asyncio.Lock()

    # ----------------------------------------------------------------- set-up
    async def open(self, used: Iterable[tuple[Any, int, int, int]]) -> set[Any]:
        """Open every extent file and free what ``used`` does not hold; where there is none,
        create an empty first one (DirectIOUnsupportedError here, not at the first put).

        ``used`` yields (tag, file_index, offset_bytes, record_bytes) per catalog entry. Returns
        the tags of entries that cannot be right (outside their file, misaligned, overlapping
        another): their space is left alone, never freed.
        """
        with map_os_errors(self.directory):
            names = self.engine.env.listdir(self.directory)
        for name in sorted(names):
            match = _FILE_NAME.match(name)
            if match is None:
                continue
            index = int(match.group(1))
            file = await self.engine.open(self._path(index), write=True, direct=self.direct)
            self.files[index] = file
            size = self.engine.file_size(file)
            usable = size - size % RECORD_ALIGNMENT_BYTES
            self.sizes[index] = min(usable, FILE_STRIDE_BYTES - RECORD_ALIGNMENT_BYTES)
        by_file: dict[int, list[tuple[int, int, Any]]] = {index: [] for index in self.files}
        bad: set[Any] = set()
        for tag, index, offset, size in used:
            if index in by_file:
                by_file[index].append((offset, size, tag))
            else:
                bad.add(tag)
        for index, extents in by_file.items():
            cursor = 0  # end of the last good extent
            for offset, size, tag in sorted(extents, key=lambda item: item[0]):
                misaligned = offset % RECORD_ALIGNMENT_BYTES
                if misaligned or offset < cursor or offset + size > self.sizes[index]:
                    bad.add(tag)  # overlaps the one before, or runs past the end of the file
                else:
                    self._free_part(index, cursor, offset - cursor)
                    cursor = offset + size
            self._free_part(index, cursor, self.sizes[index] - cursor)
        if not self.files:
            # An empty first file: opening proves O_DIRECT works here and costs no space.
            await self._add_file(0)
        return bad

    # ----------------------------------------------------------------- extents
    async def allocate(self, size_bytes: int) -> int:
        """Address of a free extent of ``size_bytes`` (a multiple of 4 KiB); grows the files
        when no hole fits. Raises NoSpaceError/StorageError when a new file cannot be made."""
        address = self._allocator.allocate(size_bytes)
        if address is not None:
            return address
        async with self._grow_lock:
            address = self._allocator.allocate(size_bytes)  # someone may have grown meanwhile
            if address is None:
                await self._grow(size_bytes)
                address = self._allocator.allocate(size_bytes)
                assert address is not None
            return address

    def locate(self, address: int) -> tuple[FileHandle, int]:
        """The file and file offset of an address."""
        index, offset = divmod(address, FILE_STRIDE_BYTES)
        return self.files[index], offset

    @staticmethod
    def split(address: int) -> tuple[int, int]:
        """(file index, file offset) of an address."""
        return divmod(address, FILE_STRIDE_BYTES)

    @staticmethod
    def address_of(file_index: int, offset_bytes: int) -> int:
        return file_index * FILE_STRIDE_BYTES + offset_bytes

    def pin(self, address: int) -> None:
        self._pins[address] = self._pins.get(address, 0) + 1

    def unpin(self, address: int) -> None:
        left = self._pins[address] - 1
        if left:
            self._pins[address] = left
            return
        del self._pins[address]
        size = self._deferred.pop(address, None)
        if size is not None:
            self._allocator.free(address, size)

    def release(self, address: int, size_bytes: int) -> None:
        """Free an extent, or, while a read of it is in flight, as soon as the last one ends."""
        if address in self._pins:
            self._deferred[address] = size_bytes
        else:
            self._allocator.free(address, size_bytes)

    # ----------------------------------------------------------------- lifecycle
    async def close(self) -> None:
        """Close every file; a dead engine (power cut, closed) is not an error here."""
        files, self.files = self.files, {}
        for file in files.values():
            with contextlib.suppress(EngineClosedError):
                await self.engine.close_file(file)

    def stats(self) -> dict[str, int]:
        return {
            "extent_files": len(self.sizes),
            "extent_file_bytes": sum(self.sizes.values()),
            "extent_free_bytes": self._allocator.free_bytes,
            "extents_pinned": len(self._pins),
            "extent_frees_deferred": len(self._deferred),
        }

    # ----------------------------------------------------------------- internals
    def _path(self, index: int) -> str:
        return os.path.join(self.directory, extent_file_name(index))

    def _free_part(self, index: int, offset: int, size: int) -> None:
        if size > 0:
            self._allocator.free(self.address_of(index, offset), size)

    async def _grow(self, size_bytes: int) -> None:
        """Take room for an extent of ``size_bytes`` from the filesystem: extend the last file
        when the extent fits there (with the free tail it may already have), else add a file."""
        last = max(self.sizes, default=None)
        if last is not None and self.sizes[last] < self.file_bytes:
            end = self.sizes[last]
            missing = size_bytes - self._allocator.free_bytes_before(self.address_of(last, end))
            if end + missing <= self.file_bytes:
                await self._extend_file(
                    last, min(self.file_bytes, end + max(missing, self.grow_bytes))
                )
                return
        await self._add_file(max(self.grow_bytes, size_bytes))

    async def _extend_file(self, index: int, size_bytes: int) -> None:
        """Preallocate file ``index`` up to ``size_bytes``, make that durable, free the new part.

        A failure leaves the part unused; whatever of it reached the disk is adopted as free
        space when the tier is next opened (no record can be there)."""
        file, old_bytes = self.files[index], self.sizes[index]
        await self.engine.preallocate(file, old_bytes, size_bytes - old_bytes)
        await self.engine.fsync(file)  # the new size (and the extents under it) is durable
        self.sizes[index] = size_bytes
        self._free_part(index, old_bytes, size_bytes - old_bytes)

    async def _add_file(self, size_bytes: int) -> None:
        """Create, preallocate and make durable one more extent file, then free its space
        (``size_bytes`` 0: an empty file, to grow later)."""
        index = max(self.files, default=-1) + 1
        if index >= MAX_EXTENT_FILES or size_bytes >= FILE_STRIDE_BYTES:
            raise InvalidArgumentError(f"extent space exhausted: file {index} of {size_bytes}")
        path = self._path(index)
        env = self.engine.env
        file = None
        try:
            file = await self.engine.open(path, write=True, create=True, direct=self.direct)
            if size_bytes:
                await self.engine.preallocate(file, 0, size_bytes)
                await self.engine.fsync(file)  # the new size (and the extents under it) is durable
            await asyncio.to_thread(fsync_directory, env, self.directory)  # and its name
        except BaseException:
            if file is not None:
                with contextlib.suppress(EngineClosedError, StorageError):
                    await self.engine.close_file(file)
            with contextlib.suppress(OSError):
                env.unlink(path)  # holds no record: a half-made file is just dropped
            raise
        self.files[index] = file
        self.sizes[index] = size_bytes
        self._free_part(index, 0, size_bytes)
