"""NvmeWrites: the put, put_many and delete half of NvmeTier, with group commit.

A put of one object and a put_many of many run the same steps, the many at once (concurrent
puts below 1 MiB are first gathered into groups that run them as one, tiers.nvme.put_gather):

1. hold the per-key locks (KeyLocks: sorted, so two put_manys cannot deadlock), check the
   capacity for all of them and reserve it (a CapacityError changes nothing);
2. allocate a free extent per object, end to end in one hole when one holds them all;
3. stage every record and write them in one engine submission (RecordIO.write_many), records
   that lie end to end as one request;
4. fdatasync each extent file written, shared with every other put in flight (GroupSync);
5. commit every catalog entry in one fsynced LMDB transaction (Catalog.apply_many); the
   catalog group-commits, so the entries of concurrent puts share transactions too;
6. only then free each key's previous extent, and acknowledge.

So a put is acknowledged only when its record is fdatasynced and its entry committed, while N
concurrent puts share about one fdatasync per file and one commit instead of N of each. On any
failure before a key's commit its new extent is freed and its old entry stays: a failed put
changes nothing. A put_many's entries commit together or not at all, so after a crash a
reopened tier holds all of its objects or none of them.

Concurrency: loop thread only; run inside ``OpGuard.shielded`` (a cancelled caller cannot leave
an extent allocated or the catalog and extents disagreeing).
Invariants: see NvmeTier.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from tiers.io.buffers import as_buffer
from tiers.io.byte_views import U8, is_tensor
from tiers.io.errors import CapacityError
from tiers.nvme.catalog import Catalog, CatalogEntry
from tiers.nvme.chunks import chunk_log2_for
from tiers.nvme.format import is_bare, key_hash, record_bytes, stored_bytes
from tiers.nvme.group_sync import GroupSync
from tiers.nvme.put_gather import PutGather
from tiers.nvme.records import RecordIO, RecordWrite
from tiers.nvme.space import ExtentSpace
from tiers.storage.op_guard import OpGuard
from tiers.storage.tier import check_key

__all__ = ["NvmeWrites"]


class NvmeWrites:
    """Mixed into NvmeTier; the attributes below are the tier's."""

    name: str
    capacity_bytes: int
    counters: dict[str, int]
    _catalog: Catalog | None
    _space: ExtentSpace | None
    _records: RecordIO | None
    _syncs: GroupSync | None
    _ops: OpGuard
    _damaged: set[str]
    _reserved_bytes: int
    _bare_from: int
    _key_locks: KeyLocks
    _put_gather: PutGather

    _open_catalog: Callable[[], Catalog]  # NvmeTier's method (declared, defined there)

    async def put(self, key: str, data: Any) -> None:
        check_key(key)
        self._open_catalog()
        payload, owner = _payload(data)
        if payload.nbytes < _GATHER_BELOW_BYTES:
            await self._put_gather.put(key, payload, owner)  # written with concurrent puts
        else:
            await self._ops.shielded(self._put_items({key: payload}, [owner]))

    async def put_many(self, items: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Store every (key, data) pair (a later pair of the same key wins) with one write
        submission, one fdatasync per extent file and one catalog commit; returns when all are
        durable. Raises as ``put`` (a CapacityError for the whole batch changes nothing)."""
        pairs = items.items() if isinstance(items, Mapping) else items
        payloads: dict[str, np.ndarray] = {}
        owners = []
        for key, data in pairs:
            check_key(key)
            payloads[key], owner = _payload(data)
            owners.append(owner)
        self._open_catalog()
        if payloads:
            await self._ops.shielded(self._put_items(payloads, owners))

    async def delete(self, key: str) -> bool:
        check_key(key)
        self._open_catalog()
        return await self._ops.shielded(self._delete(key))

    async def delete_many(self, keys: Iterable[str]) -> int:
        """Delete every key of ``keys`` with one catalog commit; how many were present."""
        held = sorted(dict.fromkeys(keys))
        for key in held:
            check_key(key)
        self._open_catalog()
        if not held:
            return 0
        return await self._ops.shielded(self._delete_many(held))

    def _entry_bytes(self, entry: CatalogEntry) -> int:
        """Bytes the entry's record takes on disk (chunked by its entry; else bare or header
        record, by the marker)."""
        if entry.chunks:
            return record_bytes(entry.size_bytes, chunked=True)
        return record_bytes(entry.size_bytes, self._is_bare(entry))

    def _is_bare(self, entry: CatalogEntry) -> bool:
        return not entry.chunks and entry.version >= self._bare_from and is_bare(entry.size_bytes)

    async def _put_items(self, items: dict[str, np.ndarray], owners: list[Any]) -> None:
        catalog, space = self._catalog, self._space
        assert catalog is not None and space is not None
        held = sorted(items)
        await self._key_locks.acquire(held)
        try:
            old = dict(zip(items, map(catalog.entries.get, items), strict=True))
            reserve = 0
            for payload, was in zip(items.values(), old.values(), strict=True):
                reserve += max(0, payload.nbytes - (was.size_bytes if was is not None else 0))
            if catalog.used_bytes + self._reserved_bytes + reserve > self.capacity_bytes:
                size = sum(p.nbytes for p in items.values())
                raise CapacityError(
                    f"tier {self.name!r}: {size} bytes for {len(items)} object(s) "
                    f"({next(iter(items))!r}...) do not fit: {catalog.used_bytes} used + "
                    f"{self._reserved_bytes} reserved of {self.capacity_bytes}"
                )
            self._reserved_bytes += reserve
            try:
                committed, error = await self._write_and_commit(items, catalog, space)
            finally:
                self._reserved_bytes -= reserve
            del owners  # every payload has been copied into its record
            damaged = self._damaged
            freed = [
                (space.address_of(was.file_index, was.offset_bytes), self._entry_bytes(was))
                for key in committed
                if (was := old[key]) is not None and key not in damaged
            ]
            space.release_many(freed)
            if damaged:
                damaged.difference_update(committed)
            self.counters["puts"] += len(committed)
            if error is not None:
                raise error
        finally:
            self._key_locks.release(held)

    async def _write_and_commit(
        self, items: dict[str, np.ndarray], catalog: Catalog, space: ExtentSpace
    ) -> tuple[list[str], BaseException | None]:
        """Steps 2-5: (the keys committed, the first commit error). Whatever fails, the new
        extent of every key that did not commit is freed."""
        assert self._records is not None and self._syncs is not None
        taken: list[tuple[int, int]] = []  # (address, bytes) of each new extent
        committed: list[str] = []
        try:
            totals = [stored_bytes(payload.nbytes) for payload in items.values()]
            addresses = await space.allocate_many(totals)
            taken = list(zip(addresses, totals, strict=True))
            writes, file_indexes = _record_writes(items, addresses, catalog, space)
            sums = await self._records.write_many(writes)
            files = {id(w.file): w.file for w in writes}
            await asyncio.gather(*(self._syncs.sync(file) for file in files.values()))
            self.counters["fdatasyncs"] = self._syncs.syncs
            # The records are durable: now the catalog may name them, all in one transaction.
            changes: list[tuple[str, CatalogEntry | None]] = [
                (key, CatalogEntry(index, w.offset, w.payload.nbytes, crc, w.version, chunks))
                for key, w, (crc, chunks), index in zip(
                    items, writes, sums, file_indexes, strict=True
                )
            ]
            try:
                await catalog.apply_many(changes)
            except Exception as exc:  # nothing committed: the caller raises it
                return [], exc
            committed = list(items)
            return committed, None
        finally:
            if not committed:  # never named by the catalog: free at once
                space.release_many(taken)

    async def _delete(self, key: str) -> bool:
        catalog, space = self._catalog, self._space
        assert catalog is not None and space is not None
        await self._key_locks.acquire([key])
        try:
            old = catalog.entries.get(key)
            if old is None:
                return False
            await catalog.apply(key, None)
            if key not in self._damaged:
                address = space.address_of(old.file_index, old.offset_bytes)
                space.release(address, self._entry_bytes(old))
            self._damaged.discard(key)
            self.counters["deletes"] += 1
            return True
        finally:
            self._key_locks.release([key])

    async def _delete_many(self, held: list[str]) -> int:
        catalog, space = self._catalog, self._space
        assert catalog is not None and space is not None
        await self._key_locks.acquire(held)
        try:
            old = {key: catalog.entries.get(key) for key in held}
            present = [(key, entry) for key, entry in old.items() if entry is not None]
            if not present:
                return 0
            await catalog.apply_many([(key, None) for key, _ in present])
            for key, entry in present:
                if key not in self._damaged:
                    address = space.address_of(entry.file_index, entry.offset_bytes)
                    space.release(address, self._entry_bytes(entry))
                self._damaged.discard(key)
            self.counters["deletes"] += len(present)
            return len(present)
        finally:
            self._key_locks.release(held)


class KeyLocks:
    """Per-key write locks, taken many at a time in sorted order (so two batches cannot
    deadlock), each handed to its waiters first come, first served. A key costs a dict entry
    while held, not an asyncio.Lock and a context manager (~6 us a key of a put_many)."""

    def __init__(self) -> None:
        self._held: dict[str, deque[asyncio.Future[None]]] = {}  # key -> its waiters

    async def acquire(self, keys: list[str]) -> None:
        """Hold every key of ``keys`` (sorted, distinct); on cancellation, none of them."""
        held = self._held
        for taken, key in enumerate(keys):
            waiters = held.get(key)
            if waiters is None:
                held[key] = deque()
                continue
            turn = asyncio.get_running_loop().create_future()
            waiters.append(turn)
            try:
                await turn
            except BaseException:
                if turn.done() and not turn.cancelled():
                    self._release(key)  # handed over just as we were cancelled
                self.release(keys[:taken])
                raise

    def release(self, keys: list[str]) -> None:
        for key in keys:
            self._release(key)

    def _release(self, key: str) -> None:
        waiters = self._held[key]
        while waiters:
            turn = waiters.popleft()
            if not turn.done():  # a cancelled waiter's future is done: skipped
                turn.set_result(None)  # the key stays held, by that waiter now
                return
        del self._held[key]


def _record_writes(
    items: dict[str, np.ndarray], addresses: list[int], catalog: Catalog, space: ExtentSpace
) -> tuple[list[RecordWrite], list[int]]:
    """(the RecordWrite of each item at its address, with a new version each, the file index
    of each); the layout of a size is worked out once per batch, not once per object."""
    writes: list[RecordWrite] = []
    file_indexes: list[int] = []
    layouts: dict[int, tuple[int, bool]] = {}  # payload bytes -> (chunk log2, bare)
    version = catalog.take_versions(len(items))
    files = space.files
    for (key, payload), address in zip(items.items(), addresses, strict=True):
        size = payload.nbytes
        layout = layouts.get(size)
        if layout is None:
            log2 = chunk_log2_for(size)
            layout = layouts[size] = (log2, not log2 and is_bare(size))
        log2, bare = layout
        file_index, file_offset = space.split(address)
        khash = 0 if bare or log2 else key_hash(key)  # stored in header records only
        writes.append(
            RecordWrite(files[file_index], file_offset, payload, version, khash, bare, log2)
        )
        file_indexes.append(file_index)
        version += 1
    return writes, file_indexes


def _payload(data: Any) -> tuple[np.ndarray, Any]:
    """(the bytes of ``data`` as a uint8 array, what keeps them alive), checked before any I/O."""
    if type(data) is np.ndarray and data.dtype is U8 and data.ndim == 1 and data.flags.c_contiguous:
        return data, data  # the common case, without a BufferRef and a memoryview (~5 us)
    device = getattr(data, "device", None)
    if is_tensor(data) and getattr(device, "type", "cpu") != "cpu":
        data = data.detach().cpu()  # the host engine stages through host memory
    ref = as_buffer(data)
    payload = np.frombuffer(ref.memoryview(), np.uint8) if ref.size_bytes else _EMPTY
    return payload, ref


_EMPTY = np.empty(0, np.uint8)
# Smaller puts are gathered (PutGather); larger ones go alone, several in flight: 16 concurrent
# 16 MiB puts gathered wrote 0.4-1.8 GB/s against 0.9-3.2 GB/s alone (benchmarks.tiers.store).
_GATHER_BELOW_BYTES = 1 << 20
