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
size_i)`` of one GrowableSpace (tiers.storage.space). The rest of each stride is never free, so
no extent straddles two files, while holes in every file are found by one segregated-fit lookup
(lowest address first, which keeps the early files full and the late ones empty). Opening
adopts each file (free but for the parts records hold); the space calls ``_grow`` when no hole
fits, and frees the part it returns (which merges with a free tail of the file).

Pins: a read pins the extent it reads; releasing a pinned extent (an overwrite or delete that
committed meanwhile) is deferred to the last unpin, so an extent is never rewritten while a read
of it is in flight (the space keeps the pins). A batch read pins its extents as one array, which
a release checks (``pin_batch``).

Concurrency: loop thread only. Growing the files is serialised by the space's asyncio lock;
blocking calls (fallocate, directory fsync) run in worker threads through the engine's Env.
Growing the last file runs beside writes of records into its older part: disjoint ranges.
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

import numpy as np

from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import EngineClosedError, InvalidArgumentError, StorageError, map_os_errors
from tiers.nvme.format import RECORD_ALIGNMENT_BYTES
from tiers.storage.directory import fsync_directory
from tiers.storage.space import GrowableSpace

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

    def __init__(
        self,
        engine: IOEngine,
        directory: str,
        file_bytes: int,
        direct: bool,
        limit_bytes: int | None = None,
    ) -> None:
        if file_bytes % RECORD_ALIGNMENT_BYTES or not 0 < file_bytes < FILE_STRIDE_BYTES:
            raise InvalidArgumentError(
                f"extent files must be a positive multiple of 4 KiB below 1 TiB: {file_bytes}"
            )
        self.engine = engine
        self.directory = directory
        self.file_bytes = file_bytes
        self.grow_bytes = min(file_bytes, GROW_STEP_BYTES)
        # Growth ahead of need stops at the tier's capacity, so its files never hold more disk
        # than it may use (only records with headers, larger than what they charge, go past).
        self.limit_bytes = limit_bytes
        self.direct = direct
        self.files: dict[int, FileHandle] = {}
        self.sizes: dict[int, int] = {}  # usable bytes of each file (a multiple of 4 KiB)
        arena = MAX_EXTENT_FILES * FILE_STRIDE_BYTES
        self._space = GrowableSpace(arena, RECORD_ALIGNMENT_BYTES, self._grow)
        self._batches: dict[int, np.ndarray] = {}  # token -> extents a batch read in flight
        self._late_pins: dict[int, list[int]] = {}  # token -> extents released meanwhile
        self._next_batch = 0

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
                by_file[index].append((self.address_of(index, offset), size, tag))
            else:
                bad.add(tag)
        for index, extents in by_file.items():
            # misaligned, overlapping the one before, or running past the end of the file
            bad.update(self._space.adopt(self.address_of(index, 0), self.sizes[index], extents))
        if not self.files:
            # An empty first file: opening proves O_DIRECT works here and costs no space.
            await self._add_file(0)
        return bad

    # ----------------------------------------------------------------- extents
    async def allocate(self, size_bytes: int) -> int:
        """Address of a free extent of ``size_bytes`` (a multiple of 4 KiB); grows the files
        when no hole fits. Raises NoSpaceError/StorageError when a new file cannot be made."""
        return await self._space.allocate(size_bytes)

    async def allocate_many(self, sizes_bytes: list[int]) -> list[int]:
        """Addresses of free extents of each size: end to end in one hole when one holds them
        all (their records then go out as one write), else one by one as ``allocate``. Raises
        as ``allocate``; nothing is taken then."""
        if len(sizes_bytes) > 1:
            start = self._space.try_allocate(sum(sizes_bytes))
            if start is not None:
                return (start + np.cumsum([0, *sizes_bytes[:-1]])).tolist()
        addresses: list[int] = []
        try:
            for size in sizes_bytes:
                addresses.append(await self._space.allocate(size))
        except BaseException:
            self._space.free_many(list(zip(addresses, sizes_bytes, strict=False)))
            raise
        return addresses

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
        self._space.pin(address)

    def unpin(self, address: int) -> None:
        self._space.unpin(address)

    def pin_batch(self, addresses: np.ndarray) -> int:
        """Pin the extents a batch read starts at (int64); returns the token for
        ``unpin_batch``. O(1): the batch is only noted, and a ``release`` meanwhile pins what
        it frees on the batch's behalf (a pin per address cost ~0.4 us per object read)."""
        token = self._next_batch
        self._next_batch += 1
        self._batches[token] = addresses
        return token

    def unpin_batch(self, token: int) -> None:
        del self._batches[token]
        for address in self._late_pins.pop(token, ()):
            self._space.unpin(address)

    def release(self, address: int, size_bytes: int) -> None:
        """Free an extent, or, while a read of it is in flight, as soon as the last one ends."""
        for token, addresses in self._batches.items():
            if (addresses == address).any():  # a batch reads it now: a pin until it ends
                self._space.pin(address)
                self._late_pins.setdefault(token, []).append(address)
        self._space.free(address, size_bytes)

    def release_many(self, extents: list[tuple[int, int]]) -> None:
        """``release`` each (address, bytes) extent; with no read in flight, in one pass that
        merges the extents that touch."""
        if self._batches:
            for address, size in extents:
                self.release(address, size)
        else:
            self._space.free_many(extents)

    # ----------------------------------------------------------------- lifecycle
    async def close(self) -> None:
        """Close every file; a dead engine (power cut, closed) is not an error here."""
        files, self.files = self.files, {}
        for file in files.values():
            with contextlib.suppress(EngineClosedError):
                await self.engine.close_file(file)

    def stats(self) -> dict[str, int]:
        space = self._space.stats()
        return {
            "extent_files": len(self.sizes),
            "extent_file_bytes": sum(self.sizes.values()),
            "extent_free_bytes": space["free"],
            "extents_pinned": space["pinned"],
            "extent_frees_deferred": space["frees_at_unpin"],
        }

    # ----------------------------------------------------------------- internals
    def _path(self, index: int) -> str:
        return os.path.join(self.directory, extent_file_name(index))

    async def _grow(self, size_bytes: int) -> list[tuple[int, int]]:
        """Take room for an extent of ``size_bytes`` from the filesystem: extend the last file
        when the extent fits there (with the free tail it may already have), else add a file.
        Returns the new part (address, size), for the space to free."""
        last = max(self.sizes, default=None)
        if last is not None and self.sizes[last] < self.file_bytes:
            end = self.sizes[last]
            missing = size_bytes - self._space.free_before(self.address_of(last, end))
            if end + missing <= self.file_bytes:
                size = min(self.file_bytes, end + max(missing, self._ahead_bytes()))
                return [await self._extend_file(last, size)]
        return [await self._add_file(max(self._ahead_bytes(), size_bytes))]

    def _ahead_bytes(self) -> int:
        """How far a growth may run ahead of the extent that needs it."""
        if self.limit_bytes is None:
            return self.grow_bytes
        room = self.limit_bytes - sum(self.sizes.values())
        room -= room % RECORD_ALIGNMENT_BYTES
        return max(0, min(self.grow_bytes, room))

    async def _extend_file(self, index: int, size_bytes: int) -> tuple[int, int]:
        """Preallocate file ``index`` up to ``size_bytes`` and make that durable; returns the
        new part.

        A failure leaves the part unused; whatever of it reached the disk is adopted as free
        space when the tier is next opened (no record can be there)."""
        file, old_bytes = self.files[index], self.sizes[index]
        await self.engine.preallocate(file, old_bytes, size_bytes - old_bytes)
        await self.engine.fsync(file)  # the new size (and the extents under it) is durable
        self.sizes[index] = size_bytes
        return self.address_of(index, old_bytes), size_bytes - old_bytes

    async def _add_file(self, size_bytes: int) -> tuple[int, int]:
        """Create, preallocate and make durable one more extent file; returns its space
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
        return self.address_of(index, 0), size_bytes
