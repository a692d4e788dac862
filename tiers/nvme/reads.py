"""NvmeReads: the get and get_many half of NvmeTier, with concurrent gets gathered.

``get_many`` is tiers.nvme.many_reads' (a batch, one submission). A single ``get`` of a whole
bare record (no byte range, no header, no chunks) on an engine that gathers single requests
itself (``IOEngine.gathers_singles``: io_uring) is that engine's own single read
(tiers.nvme.single_reads): the gets of one loop pass still share a submission, and each resumes
when its own read lands. Any other single ``get`` joins the gets of the same loop iteration:
the first one queues a gathering task, the others (from any task) add themselves, and the task
reads all of them with one ``read_many``, so N tasks each awaiting one get cost one submission,
one staging buffer and one wake-up, not N of each (a lone get pays one extra task step, ~5 us).
Each gathered get still gets its own outcome: a key that is absent reads None, a bad
destination or range raises InvalidArgumentError for that get alone, and when the shared read
fails (a damaged record, a failed request) every get of it is read again on its own, so the
error reaches only the gets whose records it concerns.

A get reads the extent named by the catalog when its read is planned and pins it, so an
overwrite or delete that commits meanwhile defers freeing it until the read ends: a get returns
the old or the new object, whole. A get cancelled before its read is planned is dropped; one
cancelled while its read is in flight has its destination unset, so its buffer is not written
after it returned (as without gathering, a check running on the CPU executor may still finish
its copy).

Concurrency: loop thread only. Invariants: a queued get is counted in flight by the tier's
OpGuard (``aclose`` waits for it); every queued get's future is resolved exactly once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from tiers.io.errors import CorruptionError, EngineClosedError
from tiers.nvme.catalog import Catalog, CatalogEntry
from tiers.nvme.chunks import window
from tiers.nvme.format import is_bare, key_hash
from tiers.nvme.many_reads import ManyReads
from tiers.nvme.records import RecordIO, RecordRead, writable_view
from tiers.nvme.single_reads import read_bare
from tiers.nvme.space import ExtentSpace
from tiers.storage.op_guard import OpGuard
from tiers.storage.tier import ByteRange, check_key, resolve_range

__all__ = ["NvmeReads"]

_Pending = tuple[str, Any, ByteRange | None, asyncio.Future[Any]]


class NvmeReads(ManyReads):
    """Mixed into NvmeTier; the attributes below are the tier's (get_many: ManyReads)."""

    name: str
    counters: dict[str, int]
    _catalog: Catalog | None
    _space: ExtentSpace | None
    _records: RecordIO | None
    _ops: OpGuard
    _damaged: set[str]
    _bare_from: int
    _state: str
    _singles_engine = False  # the engine gathers single reads itself: bare gets go straight
    _gathered: list[_Pending] | None = None  # gets waiting for the gathering task
    _gathering: asyncio.Future[None] | None = None  # that task (a reference keeps it alive)

    # NvmeTier's methods this half calls (declared, not defined: the tier defines them)
    _open_catalog: Callable[[], Catalog]
    _file_path: Callable[[int], str]

    async def get(
        self, key: str, *, into: Any = None, byte_range: ByteRange | None = None
    ) -> Any | None:
        check_key(key)
        catalog = self._open_catalog()
        if byte_range is None and self._singles_engine:
            entry = catalog.entries.get(key)
            if (
                entry is not None
                and not entry.chunks
                and entry.version >= self._bare_from
                and is_bare(entry.size_bytes)
                and key not in self._damaged
            ):
                return await self._get_bare(entry, into)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self._gathered is None:
            self._gathered = []
            self._ops.enter()  # until the task ends: aclose waits for queued gets too
            self._gathering = asyncio.ensure_future(self._serve_gathered())
        self._gathered.append((key, into, byte_range, future))
        return await future

    async def _get_bare(self, entry: CatalogEntry, into: Any) -> Any:
        """A whole bare record as one engine single read (tiers.nvme.single_reads)."""
        counters = self.counters
        counters["gets"] += 1  # as a gathered get counts it: before its checks
        size = entry.size_bytes
        out = None if into is None else writable_view(into, size)  # before any I/O
        space, records = self._space, self._records
        file = None if space is None else space.files.get(entry.file_index)
        if space is None or file is None or records is None:
            raise EngineClosedError(f"tier {self.name!r} is {self._state}, not open")
        address = space.address_of(entry.file_index, entry.offset_bytes)
        space.pin(address)  # no await since the catalog named it: the extent is still its
        ops = self._ops
        ops.enter()
        try:
            got = await read_bare(records, file, entry.offset_bytes, size, entry.crc32, out)
        except CorruptionError:
            counters["corruptions"] += 1
            raise
        finally:
            ops.leave()
            space.unpin(address)
        counters["hits"] += 1
        return into if into is not None else got

    # ----------------------------------------------------------------- gathering
    async def _serve_gathered(self) -> None:
        """Read every get queued before this task's first step, in one submission."""
        pending, self._gathered = self._gathered or [], None
        try:
            live = [p for p in pending if not p[3].done()]  # cancelled ones are dropped
            self.counters["gets"] += len(live)
            reads: list[RecordRead] = []
            owners: list[_Pending] = []
            for item in live:
                key, into, byte_range, future = item
                try:
                    read = self._plan(key, into, byte_range)
                except Exception as exc:  # this get's own error (bad range, damaged entry)
                    future.set_exception(exc)
                    continue
                if read is None:
                    self.counters["misses"] += 1
                    future.set_result(None)
                    continue
                if read.out is not None:
                    future.add_done_callback(functools.partial(_unset_if_cancelled, read))
                reads.append(read)
                owners.append(item)
            if not reads:
                return
            try:
                got = await self._execute(reads, count_corruption=len(reads) == 1)
            except Exception as exc:
                if len(reads) == 1:
                    _settle_error(owners[0][3], exc)
                    return
                await self._serve_alone(reads, owners)  # each get gets its own outcome
                return
            for (_, into, _, future), value in zip(owners, got, strict=True):
                if not future.done():
                    future.set_result(value if into is None else into)
        finally:
            for *_, future in pending:
                future.cancel()  # only if this task was cancelled before settling it
            self._ops.leave()

    async def _serve_alone(self, reads: list[RecordRead], owners: list[_Pending]) -> None:
        for read, (_, into, _, future) in zip(reads, owners, strict=True):
            if future.done():
                continue
            try:
                value = (await self._execute([read], count_corruption=True))[0]
            except Exception as exc:
                _settle_error(future, exc)
                continue
            if not future.done():
                future.set_result(value if into is None else into)

    # ----------------------------------------------------------------- reads
    def _plan(self, key: str, into: Any, byte_range: ByteRange | None) -> RecordRead | None:
        """The read of ``key``'s record (None: absent), checked before any I/O."""
        catalog = self._catalog  # not _open_catalog: a tier closing still serves queued gets
        if catalog is None:
            raise EngineClosedError(f"tier {self.name!r} is {self._state}, not open")
        entry = catalog.entries.get(key)
        if entry is None:
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
        space = self._space
        file = None if space is None else space.files.get(entry.file_index)
        if file is None:
            raise EngineClosedError(f"tier {self.name!r} is {self._state}, not open")
        if entry.chunks:  # only the chunks that cover the range
            first, start, length = window(entry.size_bytes, entry.chunks[2], offset, size)
            return RecordRead(
                file, entry.offset_bytes, entry, 0, False, offset, size, out, start, length, first
            )
        bare = entry.version >= self._bare_from and is_bare(entry.size_bytes)
        khash = 0 if bare else key_hash(key)  # a bare record's check needs no key hash
        return RecordRead(file, entry.offset_bytes, entry, khash, bare, offset, size, out)

    async def _execute(self, reads: list[RecordRead], *, count_corruption: bool) -> list[Any]:
        """Move and check ``reads`` in one submission, their extents pinned meanwhile (no await
        since they were planned: the extents are still theirs)."""
        space, records = self._space, self._records
        assert space is not None and records is not None
        addresses = [space.address_of(r.entry.file_index, r.offset) for r in reads]
        for address in addresses:
            space.pin(address)
        try:
            with self._ops.track():
                got = await records.read_many(reads)
        except CorruptionError:
            if count_corruption:
                self.counters["corruptions"] += 1
            raise
        finally:
            for address in addresses:
                space.unpin(address)
        self.counters["hits"] += len(reads)
        return got


def _unset_if_cancelled(read: RecordRead, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        read.out = None  # the caller is gone: leave its buffer alone


def _settle_error(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
