"""TenantStore: the tenancy's file ``tenants.dat``: home copies and shortlist runs.

One PostingStore (posting_format records, checked, copy-on-write, tail-page appends) over its
own file holds two kinds of lists, numbered from one counter:

- **home blocks**: every vector of a tenancy index once, in arrival order, ``home_records``
  a block (about 256 KiB). A vector's *location* is ``pid << 12 | position`` in its block. A grant's
  settling reads the vector from here (the page or two holding it, all in one submission),
  and so does a search of a tenant with pending grants.
- **shortlists**: a copy of each vector of one (tenant, tree node) shortlist, back to back, so
  that a small tenant's search reads one run. A record's ``version`` field holds the low 32 bits
  of the vector's location: a copy of an earlier incarnation of a deleted and re-inserted id
  does not match its current location and is not used.

- **compact copies** (``codes``, with an Sq8Codec: ip and cosine indexes of float vectors):
  every shortlist run has a twin under the same list number in a second directory over the
  same file and page space, its vectors a byte a dimension (408-byte records at 384
  dimensions against 1,560): the same ids, versions and order, written in the same call as
  the run (``write``, ``append``, ``release``), so checkpoints, crashes and the log's replay
  treat both alike. A search reads a twin in place of its run only while the twin is whole
  (``twins``: written, same count, no write of the list in flight); else the run.

Disk cost: one record per vector (home) plus one per (vector, tenant) pair, each
``record_bytes(dim, dtype)``, plus the twins (``record_bytes(dim, uint8)`` a pair), plus the
free space copy-on-write keeps until a checkpoint.
Freed list numbers are reused (a reader that snapshotted the old run still reads the old run:
PostingStore). Home blocks of deleted vectors are not compacted.

Concurrency: loop thread only; updates run under the index's update lock.
"""

from __future__ import annotations

from collections.abc import Awaitable
from contextlib import aclosing

import numpy as np

from tiers.io import CorruptionError, FileHandle, IOEngine, aligned_empty
from vectordb.metric import Metric
from vectordb.posting_format import PAGE_BYTES, decode, pages_for
from vectordb.posting_reads import PostingRead
from vectordb.posting_store import PostingBatch, PostingItem, PostingStore
from vectordb.tenancy.sq8 import Sq8Codec

__all__ = ["POSITION_BITS", "TenantStore", "location_versions"]

POSITION_BITS = 12
_POSITION_MASK = (1 << POSITION_BITS) - 1
# a grant reads only a record's own pages, so blocks can be large: fewer lists in the directory
_HOME_BLOCK_BYTES = 256 << 10


async def _landed(read: PostingRead, n: int) -> list[np.ndarray]:
    async with aclosing(read.groups()) as groups:
        async for _ in groups:
            pass
    return read.views(0, n)


def location_versions(locations: np.ndarray) -> np.ndarray:
    """The ``version`` a copy of a vector at these home locations carries."""
    return (np.asarray(locations, np.int64) & 0xFFFFFFFF).astype(np.uint32)


class TenantStore:
    def __init__(self, engine: IOEngine, file: FileHandle, dim: int, dtype: str, pages: int):
        self.lists = PostingStore(engine, file, dim, dtype, pages)
        self.codes = PostingStore(engine, file, dim, "uint8", 0)
        self.codes.space = self.lists.space  # one file, one allocator: twins beside runs
        self.codec: Sq8Codec | None = None  # set by ``train_codes``; None: no twins
        self.writing: dict[int, int] = {}  # list -> writes in flight (its twin is not whole)
        block = _HOME_BLOCK_BYTES // self.lists.rec_bytes
        self.home_records = max(1, min(1 << POSITION_BITS, block))
        self.home_pid = -1  # the block being filled
        self.next_pid = 0
        self.free_pids: list[int] = []

    def take_pid(self) -> int:
        if self.free_pids:
            return self.free_pids.pop()
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        return pid

    def release(self, pid: int) -> None:
        """Forget a shortlist run (its pages are reused after the next checkpoint)."""
        self.lists.drop(pid)
        self.codes.drop(pid)
        self.free_pids.append(pid)

    # ----------------------------------------------------------------- home copies
    async def put_home(self, ids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
        """Append home copies; returns their locations (int64)."""
        locations = np.zeros(len(ids), np.int64)
        filled = self.run_count(self.home_pid) if self.home_pid >= 0 else self.home_records
        take = min(self.home_records - filled, len(ids))
        appends, writes = [], []
        if take > 0:  # the rest of the block being filled
            locations[:take] = (self.home_pid << POSITION_BITS) + filled + np.arange(take)
            appends.append(self._home_item(self.home_pid, ids, vectors, locations, 0, take))
        for at in range(take, len(ids), self.home_records):
            self.home_pid = self.take_pid()
            end = min(at + self.home_records, len(ids))
            locations[at:end] = (self.home_pid << POSITION_BITS) + np.arange(end - at)
            item = self._home_item(self.home_pid, ids, vectors, locations, at, end)
            item.capacity = self.home_records
            writes.append(item)
        await self.lists.append(appends)
        await self.lists.write(writes)
        return locations

    @staticmethod
    def _home_item(
        pid: int, ids: np.ndarray, vectors: np.ndarray, locations: np.ndarray, a: int, b: int
    ) -> PostingItem:
        return PostingItem(pid, ids[a:b], location_versions(locations[a:b]), vectors[a:b])

    async def read_home(self, ids: np.ndarray, locations: np.ndarray) -> np.ndarray:
        """The stored vectors of ``ids`` at ``locations``: only the page or two holding each
        record is read (all in one submission), and every record is checked."""
        records = await self.read_home_records(ids, locations)
        wrong = records["id"] != ids
        if wrong.any():
            raise CorruptionError(
                f"home copy of id {int(ids[wrong][0])} holds id {int(records['id'][wrong][0])}"
            )
        return records["vector"]

    async def read_home_records(self, ids: np.ndarray, locations: np.ndarray) -> np.ndarray:
        """The records (id, version, vector) at the home ``locations`` of ``ids``, checked
        (posting_format), in one submission; a search's read of pending grants, which
        drops a record whose id is not the one asked for (its caller checks access anyway)."""
        lists = self.lists
        if not len(ids):
            return np.zeros(0, lists.dtype)
        locations = np.asarray(locations, np.int64)
        pids = locations >> POSITION_BITS
        at = lists.start[pids] * PAGE_BYTES + (locations & _POSITION_MASK) * lists.rec_bytes
        first_page = at // PAGE_BYTES
        pages = (at + lists.rec_bytes - 1) // PAGE_BYTES - first_page + 1
        buffer_pages = np.concatenate([[0], np.cumsum(pages)])
        buffer = aligned_empty(int(buffer_pages[-1]) * PAGE_BYTES)
        await lists.engine.read_batch(
            lists.file, buffer, first_page * PAGE_BYTES, pages * PAGE_BYTES,
            buffer_pages[:-1] * PAGE_BYTES,
        )  # fmt: skip
        # records are whole 8-byte words (posting_format): gather words, not bytes (an
        # index array an eighth the size: a byte gather took most of a grant's time)
        words = (buffer_pages[:-1] * PAGE_BYTES + at % PAGE_BYTES) // 8
        raw = buffer.view(np.uint64)[words[:, None] + np.arange(lists.rec_bytes // 8)]
        lists.counters["pages_read"] += int(buffer_pages[-1])
        return decode(raw.view(np.uint8).reshape(-1), len(ids), lists.dtype, pids)

    # ----------------------------------------------------------------- shortlists
    async def read(self, pids: np.ndarray) -> PostingBatch:
        return await self.lists.read(np.asarray(pids, np.int64))

    async def read_views(self, pids: np.ndarray) -> list[np.ndarray]:
        """Each list's records, verified, as views into one read's buffer (one submission;
        a search's read: nothing is copied, unlike ``read``)."""
        return await self.start_views(pids)

    def start_views(self, pids: np.ndarray) -> Awaitable[list[np.ndarray]]:
        """``read_views``, the run directory taken and the read submitted now, not when the
        caller next yields: a run freed and its number reused meanwhile (a split, a merge)
        must not be read under the old number."""
        return _landed(self.lists.begin_read(np.asarray(pids, np.int64)), len(pids))

    async def write(self, items: list[PostingItem]) -> None:
        await self._both(items, append=False)

    async def append(self, items: list[PostingItem]) -> None:
        await self._both(items, append=True)

    async def _both(self, items: list[PostingItem], append: bool) -> None:
        """Runs and their twins (a twin whose write did not complete is dropped)."""
        codec = self.codec
        if not items:
            return
        if codec is None:
            await (self.lists.append(items) if append else self.lists.write(items))
            return
        twins = [
            PostingItem(i.pid, i.ids, i.versions, codec.encode(i.vectors), i.capacity)
            for i in items
        ]
        pids = [item.pid for item in items]
        for pid in pids:
            self.writing[pid] = self.writing.get(pid, 0) + 1
        done = False
        try:
            await (self.lists.append(items) if append else self.lists.write(items))
            await (self.codes.append(twins) if append else self.codes.write(twins))
            done = True
        finally:
            for pid in pids:
                left = self.writing[pid] - 1
                if left:
                    self.writing[pid] = left
                else:
                    del self.writing[pid]
                if not done:
                    self.codes.drop(pid)

    def train_codes(self, stored: np.ndarray, metric: Metric, seed: int) -> None:
        """A codec from the vectors (a bulk load, before its runs are written); twins are
        kept from then on (none where Sq8Codec.supports says no)."""
        dtype = self.lists.dtype["vector"].base
        if len(stored) and Sq8Codec.supports(metric, str(dtype)):
            self.codec = Sq8Codec.train(stored, seed)

    def twins(self, pids: np.ndarray) -> np.ndarray:
        """bool per list: its twin is whole now (same records as the run, none in flight)."""
        pids = np.asarray(pids, np.int64)
        if self.codec is None or not len(pids):
            return np.zeros(len(pids), bool)
        codes = self.codes
        inside = pids < len(codes.capacity)
        ok = np.zeros(len(pids), bool)
        held = pids[inside]
        ok[inside] = (codes.capacity[held] > 0) & (codes.count[held] == self.lists.count[held])
        if self.writing:
            ok &= ~np.isin(pids, np.fromiter(self.writing, np.int64, len(self.writing)))
        return ok

    def start_twin_views(self, pids: np.ndarray) -> Awaitable[list[np.ndarray]]:
        """``start_views`` of the twins (call ``twins`` first, in the same loop turn)."""
        return _landed(self.codes.begin_read(np.asarray(pids, np.int64)), len(pids))

    def begin_runs(self, pids: np.ndarray, n_groups: int = 1) -> PostingRead:
        """The runs of ``pids`` read as ``start_views`` reads them (directory taken and
        reads submitted now), handed over as the read itself: its buffer, each list's byte
        offset and count, and ``groups()`` to await (each group checked as it lands) -- a
        batch search scores records where they are, group by group."""
        return self.lists.begin_read(np.asarray(pids, np.int64), n_groups)

    def begin_twins(self, pids: np.ndarray, n_groups: int = 1) -> PostingRead:
        """``begin_runs`` of the twins (call ``twins`` first, in the same loop turn)."""
        return self.codes.begin_read(np.asarray(pids, np.int64), n_groups)

    def run_count(self, pid: int) -> int:
        return int(self.lists.count[pid])

    def snapshot(self) -> dict[str, np.ndarray]:
        out = {f"tenant_lists_{k}": v for k, v in self.lists.snapshot().items()}
        if self.codec is not None:
            out.update({f"tenant_codes_{k}": v for k, v in self.codes.snapshot().items()})
            out.update(self.codec.snapshot())
        return out

    def restore(self, arrays: dict[str, np.ndarray], next_pid: int, home_pid: int) -> None:
        """The directories of a checkpoint; the page space adopts runs and twins at once."""
        self.codec = Sq8Codec.restore(arrays)
        stores = [("tenant_lists", self.lists)]
        if self.codec is not None:
            stores.append(("tenant_codes", self.codes))
        used: list[tuple[int, int]] = []
        for prefix, store in stores:
            start, capacity = arrays[f"{prefix}_start"], arrays[f"{prefix}_capacity"]
            store.start, store.capacity = start.copy(), capacity.copy()
            store.count = arrays[f"{prefix}_count"].copy()
            live = np.flatnonzero(capacity > 0)
            pages = pages_for(capacity[live].astype(np.int64), store.rec_bytes)
            used += zip(start[live].tolist(), pages.tolist(), strict=True)
        self.lists.space.adopt(used)
        self.next_pid, self.home_pid = next_pid, home_pid

    def directory_bytes(self) -> int:
        """What the two run directories and the codec hold in memory."""
        held = [*self.lists.snapshot().values(), *self.codes.snapshot().values()]
        codec = self.codec.resident_bytes() if self.codec is not None else 0
        return sum(a.nbytes for a in held) + codec

    def disk_bytes(self) -> int:
        """The file's size (it grows a quarter at a time)."""
        return int(self.lists.space.file_pages) * 4096

    def used_bytes(self) -> int:
        """Pages runs hold, freed ones awaiting a checkpoint included."""
        space = self.lists.space.stats()
        return (int(space["file_pages"]) - int(space["free_pages"])) * 4096
