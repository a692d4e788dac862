"""SpannIndex: the disk-resident vector index (the public face of vectordb).

Files in the index directory: ``LOCK`` (one owner at a time, any process), ``meta/`` (LMDB: the
last checkpoint), ``postings.dat`` (posting lists, O_DIRECT), ``wal-*.log`` (updates since the
checkpoint), and with ``IndexConfig(tenancy=True)`` ``tenants.dat`` (vectordb.tenancy: home
copies and every tenant's shortlists). Opening loads the checkpoint and replays the log, so
every acknowledged insert and delete is there after a crash, ``kill -9`` included.

Work is split by concern: build.py (bulk build), search.py, updates.py (insert, delete, split,
merge, reassign), checkpoint.py. This module holds the state they share and the lifecycle.

Concurrency: one asyncio loop (the I/O engine is bound to it). Searches run concurrently with
each other and with one updater; updates and checkpoints are serialised by ``update_lock``.
Machinery comes from an IORuntime (``runtime=``; default: the process's): the engine of the
caller's loop, shared with every other product on it, and the runtime's CPU executor for
scoring, so a hundred indexes in one process share one ring and one CPU budget.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import Executor
from typing import Any

import numpy as np

from tiers.io import (
    EngineClosedError,
    FileHandle,
    FileMissingError,
    IOEngine,
    IORuntime,
    cap_heap_retention,
    default_env,
    default_runtime,
    trim_heap,
)
from tiers.storage import lock_directory, unlock_directory
from vectordb import dot_kernel, head_scan
from vectordb.config import IndexConfig, SearchParams, default_postings
from vectordb.errors import IndexClosedError, IndexConfigError
from vectordb.gather import SearchGatherer
from vectordb.memory_budget import MemoryBudget
from vectordb.meta import MetaStore
from vectordb.metric import Metric
from vectordb.navigator import Navigator
from vectordb.posting_store import PostingStore
from vectordb.scrub_report import RepairReport, ScrubReport
from vectordb.search_result import SearchResult
from vectordb.tenancy import Tenancy
from vectordb.tenancy.tenant_store import TenantStore
from vectordb.version_map import VersionMap
from vectordb.wal import WriteAheadLog

__all__ = ["SpannIndex"]

POSTINGS_FILE = "postings.dat"
TENANTS_FILE = "tenants.dat"


class SpannIndex:
    """Create with :meth:`create`, reopen with :meth:`open`; close with :meth:`aclose`."""

    def __init__(self, directory: str, config: IndexConfig, runtime: IORuntime, engine: IOEngine):
        self.directory = directory
        self.config = config
        self.metric = Metric(config.metric)
        self.runtime = runtime
        self.engine = engine  # leased from the runtime: released in _release
        self.navigator = Navigator(config.dim, self.metric, config.navigator)
        self.versions = VersionMap()
        self.store: PostingStore
        self.meta: MetaStore
        self.wal = WriteAheadLog(engine, directory)
        self.tenancy: Tenancy | None = None  # with config.tenancy: made by _start
        self._tenant_file: FileHandle | None = None
        self.update_lock = asyncio.Lock()
        self.next_pid = 0
        self.merge_candidates: set[int] = set()
        self.searches: set[asyncio.Future[None]] = set()
        # head scans running on the scoring thread while the loop thread goes on (search.py):
        # the heads must not change under them (rebalance awaits heads_quiet first)
        self.head_scans: set[asyncio.Future[Any]] = set()
        self.gatherer: SearchGatherer | None = None  # made by the first small search
        self.tenant_gatherer: SearchGatherer | None = None  # ... and tenant search
        self.memory = MemoryBudget(None)  # replaced by create/open with the caller's budget
        # lists a query reads by default, as last measured on the index (probe_rule.py); the
        # measure's entry for the checkpoint state (None: not measured), and the one the last
        # checkpoint read or written holds (fit_memory takes it instead of measuring again)
        self.measured_postings = default_postings(0)
        self.measure_entry: dict[str, Any] | None = None
        self.saved_measure: dict[str, Any] = {}
        self.measure_source = "floor"  # "measured", "checkpoint" or "floor" (stats)
        self.checkpointed_lsn = -1  # the log position the last checkpoint holds everything to
        self.counters = {"queries": 0, "inserts": 0, "deletes": 0, "splits": 0, "merges": 0}
        self.counters.update({"reassigned": 0, "checkpoints": 0, "wal_replayed": 0})
        self.counters["corrupt_lists_skipped"] = 0  # list reads a search answered without
        self.corrupt_lists: set[int] = set()  # lists seen failing their check, until repaired
        self._lock_fd = -1
        self._file: FileHandle | None = None
        self._closed = False

    async def heads_quiet(self) -> None:
        """Wait until no head scan runs on another thread: call before changing the heads."""
        while self.head_scans:
            await asyncio.wait(list(self.head_scans))

    @property
    def scorer(self) -> Executor:
        """The runtime's CPU executor: it checks and scores read posting lists and scans half
        the heads of a large batch (search.py), so that work overlaps the loop thread's I/O
        submission, within the process's CPU budget."""
        return self.runtime.cpu

    # ----------------------------------------------------------------- lifecycle
    @classmethod
    async def create(
        cls,
        directory: str | os.PathLike[str],
        config: IndexConfig,
        *,
        runtime: IORuntime | None = None,
        direct: bool = True,
        memory_budget_bytes: int | None = None,
    ) -> SpannIndex:
        """A new, empty index in ``directory`` (created if missing; must not hold an index).
        ``memory_budget_bytes``: what the index may keep in memory (vectordb.memory_budget);
        None: no cap, no list cache."""
        from vectordb.checkpoint import write_checkpoint

        budget = _checked_budget(memory_budget_bytes)
        if budget is not None:  # before the open's own scratch (the LMDB check reads ~MBs)
            cap_heap_retention()
        index = await cls._start(os.fspath(directory), config, runtime, direct, existing=False)
        try:
            index.memory = MemoryBudget(budget)
            await index.wal.start_segment(0)
            await write_checkpoint(index)
            await index.fit_memory()
        except BaseException:
            await index._release()
            raise
        index.scorer.submit(_warm_up, index.config.numpy_dtype)
        return index

    @classmethod
    async def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        runtime: IORuntime | None = None,
        direct: bool = True,
        memory_budget_bytes: int | None = None,
    ) -> SpannIndex:
        """Reopen an index: load its checkpoint and replay its write-ahead log.
        ``memory_budget_bytes``: as for :meth:`create`."""
        from vectordb.checkpoint import load_checkpoint

        budget = _checked_budget(memory_budget_bytes)
        if budget is not None:  # before the open's own scratch (the LMDB check reads ~MBs)
            cap_heap_retention()
        index = await cls._start(os.fspath(directory), None, runtime, direct, existing=True)
        try:
            index.memory = MemoryBudget(budget)
            await load_checkpoint(index)
            await index.fit_memory()
        except BaseException:
            await index._release()
            raise
        index.scorer.submit(_warm_up, index.config.numpy_dtype)  # not in the first search
        return index

    @classmethod
    async def _start(
        cls,
        directory: str,
        config: IndexConfig | None,
        runtime: IORuntime | None,
        direct: bool,
        existing: bool,
    ) -> SpannIndex:
        if existing and not os.path.isdir(os.path.join(directory, "meta")):  # noqa: ASYNC240
            raise FileMissingError(2, "no vector index here", directory)
        runtime = runtime or default_runtime()
        env = runtime.env or default_env
        lock_fd = lock_directory(directory, env)
        try:
            meta = MetaStore(os.path.join(directory, "meta"))
            saved_config = meta.read_config()  # the arrays: once, by load_checkpoint
        except BaseException:
            unlock_directory(lock_fd, env)
            raise
        if existing:
            assert saved_config is not None
            config = IndexConfig.from_dict(saved_config)
        elif saved_config is not None:
            meta.close()
            unlock_directory(lock_fd, env)
            raise IndexConfigError(f"{directory!r} already holds an index; use SpannIndex.open")
        assert config is not None
        index = cls(directory, config, runtime, runtime.acquire_engine())
        index._lock_fd, index.meta = lock_fd, meta
        try:
            path = os.path.join(directory, POSTINGS_FILE)
            index._file = await index.engine.open(path, write=True, create=True, direct=direct)
            pages = index.engine.file_size(index._file) // 4096
            index.store = PostingStore(index.engine, index._file, config.dim, config.dtype, pages)
            if config.tenancy:
                await index._open_tenancy(direct)
        except BaseException:
            await index._release()
            raise
        return index

    async def _open_tenancy(self, direct: bool) -> None:
        path = os.path.join(self.directory, TENANTS_FILE)
        self._tenant_file = await self.engine.open(path, write=True, create=True, direct=direct)
        pages = self.engine.file_size(self._tenant_file) // 4096
        config = self.config
        store = TenantStore(self.engine, self._tenant_file, config.dim, config.dtype, pages)
        self.tenancy = Tenancy(config, self.metric, store)

    async def aclose(self) -> None:
        """Checkpoint if anything changed (so reopening replays nothing), then release files,
        lock and engine."""
        if self._closed:
            return
        from vectordb.checkpoint import checkpoint

        try:
            if not self.engine.closed and self._changed_since_checkpoint():
                await checkpoint(self)
        except EngineClosedError:
            pass  # the engine died under us (a power cut): the log still holds every update
        finally:
            await self._release()

    async def fit_memory(self) -> None:
        """Split the memory budget again and set the default list count (after the heads
        changed: build, reopen, checkpoint): the one the checkpoint holds for these heads,
        else measured (probe_rule.py) and kept with the checkpoint."""
        from vectordb import probe_rule
        from vectordb.search import READ_BUFFER_BYTES

        await self.memory.apply(self, READ_BUFFER_BYTES)
        saved = probe_rule.saved_postings(self.saved_measure, self.navigator.n_heads)
        self.saved_measure = {}
        if saved is not None:  # no list read, no scratch: what a tight open can afford
            self.measured_postings, self.measure_source = saved, "checkpoint"
            self.measure_entry = probe_rule.record(saved, self.navigator.n_heads)
            return
        if not probe_rule.worth_measuring(self):
            self.measured_postings = await probe_rule.measure_postings(self)  # the floor
            self.measure_entry, self.measure_source = None, "floor"
            return
        self.measured_postings = await probe_rule.measure_postings(self)
        self.measure_source = "measured"
        self.measure_entry = probe_rule.record(self.measured_postings, self.navigator.n_heads)
        if self.memory.budget_bytes is not None:
            trim_heap()  # the measure's reads and distances: only while it ran
        await self._keep_measure()

    async def _keep_measure(self) -> None:
        """Add the measure to the last checkpoint's state if nothing was logged since it
        (else the lists it measured are not the checkpoint's: the next checkpoint keeps it)."""
        from vectordb.probe_rule import STATE_KEY

        async with self.update_lock:
            lsn = self.checkpointed_lsn
            if lsn != self.wal.next_lsn or self.engine.closed or self.measure_entry is None:
                return
            values = {STATE_KEY: self.measure_entry}
            await self.runtime.run_blocking(self.meta.update_state, values, lsn)

    def _changed_since_checkpoint(self) -> bool:
        """Whether anything was logged, or runs wait to be freed, since the last checkpoint
        (closing an index that only answered searches writes nothing)."""
        pending = self.store.space.stats()["pending_free_runs"]
        return self.wal.next_lsn != self.checkpointed_lsn or bool(pending)

    async def _release(self) -> None:
        self._closed = True
        await self.memory.aclose()
        if not self.engine.closed:
            await self.wal.close()
            if self._file is not None:
                await self.engine.close_file(self._file)
            if self._tenant_file is not None:
                await self.engine.close_file(self._tenant_file)
        await self.runtime.release_engine(self.engine)
        if getattr(self, "meta", None) is not None:
            self.meta.close()
        if self._lock_fd >= 0:
            unlock_directory(self._lock_fd, self.engine.env)
            self._lock_fd = -1
        if self.memory.budget_bytes is not None:
            trim_heap()  # what it held goes back to the OS, not to a heap a reopening grows

    async def __aenter__(self) -> SpannIndex:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def check_open(self) -> None:
        if self._closed or self.engine.closed:
            raise IndexClosedError(f"the index at {self.directory!r} is closed")

    # ----------------------------------------------------------------- operations
    async def build(
        self,
        ids: Any,
        vectors: Any,
        *,
        tenants: Any = None,
        progress: bool = False,
        batch_rows: int = 65536,
    ) -> None:
        """Bulk-build an empty index from ``vectors`` (ids None: 0..n-1). Atomic: a crash in
        the middle leaves the index empty. ``tenants``: who may read each row (a tenancy
        index; the forms of vectordb.tenancy.tenant_rows)."""
        from vectordb.build import build

        self.check_open()
        await build(self, ids, vectors, tenants, progress=progress, batch_rows=batch_rows)
        await self.fit_memory()

    async def build_from(
        self,
        source: Any,
        *,
        column: str | None = None,
        id_column: str | None = None,
        progress: bool = False,
    ) -> None:
        """Bulk-build from a file (``.npy``, ``.fvecs``/``.bvecs``, Arrow IPC, Parquet) or an
        in-memory array/table; see vectordb.vectors_input.load_vectors."""
        from vectordb.vectors_input import load_vectors

        ids, vectors = load_vectors(source, column=column, id_column=id_column)
        await self.build(ids, vectors, progress=progress)

    async def search(
        self, queries: Any, k: int = 10, params: SearchParams | None = None, *, tenant: Any = None
    ) -> SearchResult:
        """(ids int64 [Q, k], scores float32 [Q, k]) of each query's k nearest live vectors;
        missing results are id -1. Scores: squared L2 ascending, or similarity descending.
        ``k`` above the live vectors is cut to them. A list that fails its check is left out
        and named in the result's ``skipped_lists`` (``params.strict``: CorruptionError).
        ``tenant``: one tenant id, or one per query: only vectors that tenant may read at that
        moment (a tenancy index; an unknown tenant gets no results)."""
        self.check_open()
        if tenant is not None:
            from vectordb.tenancy import logged

            return await logged.search(self, queries, k, params or SearchParams(), tenant)
        from vectordb.search import search

        return await search(self, queries, k, params or SearchParams())

    async def insert(self, ids: Any, vectors: Any, tenants: Any = None) -> None:
        """Add vectors under new ids; durable (in the log) when this returns. ``tenants``: who
        may read each row (a tenancy index; the forms of vectordb.tenancy.tenant_rows)."""
        from vectordb.updates import insert

        self.check_open()
        await insert(self, ids, vectors, tenants)

    async def grant(self, ids: Any, tenant: Any) -> int:
        """Let ``tenant`` read ``ids`` (unknown, deleted or already granted ids are ignored);
        returns the pairs added. Durable when this returns."""
        from vectordb.tenancy import logged

        self.check_open()
        return await logged.grant(self, ids, tenant)

    async def revoke(self, ids: Any, tenant: Any) -> int:
        """Stop ``tenant`` reading ``ids``; returns the pairs removed. Durable on return."""
        from vectordb.tenancy import logged

        self.check_open()
        return await logged.revoke(self, ids, tenant)

    async def delete_tenant(self, tenant: Any) -> int:
        """Drop every grant of ``tenant`` (the vectors stay); returns how many there were."""
        from vectordb.tenancy import logged

        self.check_open()
        return await logged.delete_tenant(self, tenant)

    def count(self, tenant: Any) -> int:
        """Live vectors ``tenant`` may read."""
        from vectordb.tenancy import check_tenant, logged

        return logged.require(self).count(check_tenant(tenant))

    def tenants_of(self, vid: Any) -> list[Any]:
        """The tenants that may read id ``vid`` (in the order they were first used)."""
        from vectordb.tenancy import logged

        return logged.require(self).tenants_of(int(vid))

    async def delete(self, ids: Any) -> int:
        """Delete ids (unknown or already deleted ones are ignored); returns how many were
        live. Durable when this returns."""
        from vectordb.updates import delete

        self.check_open()
        return await delete(self, ids)

    async def checkpoint(self) -> None:
        """Write the whole in-memory state to LMDB and start a new, empty log."""
        from vectordb.checkpoint import checkpoint

        self.check_open()
        await checkpoint(self)
        await self.fit_memory()

    async def verify(self) -> ScrubReport:
        """Read and check every posting list (updates wait meanwhile); see vectordb.scrub."""
        from vectordb.scrub import verify

        self.check_open()
        return await verify(self)

    async def repair(self) -> RepairReport:
        """Rebuild every corrupt list from its members' replicas in other lists, checkpoint,
        and report what could not be recovered; see vectordb.scrub."""
        from vectordb.scrub import repair

        self.check_open()
        return await repair(self)

    def data_files(self) -> list[str]:
        """Files whose pages a search reads (for cold-cache benchmarks)."""
        files = [os.path.join(self.directory, POSTINGS_FILE)]
        if self.tenancy is not None:
            files.append(os.path.join(self.directory, TENANTS_FILE))
        return files

    def stats(self) -> dict[str, Any]:
        n_vectors = self.versions.live_count
        raw = n_vectors * self.config.raw_bytes_per_vector
        resident = MemoryBudget.resident_bytes(self)
        return {
            "n_vectors": n_vectors,
            "n_heads": self.navigator.n_heads,
            "default_max_postings": self.default_max_postings,
            "default_max_postings_floor": default_postings(self.navigator.n_heads),
            # where the default came from: "measured" here, read from the "checkpoint", "floor"
            "default_max_postings_source": self.measure_source,
            "resident_bytes": resident,
            # the heads and the structure that finds a query's nearest (counted in the budget)
            "navigator_bytes": self.navigator.resident_bytes(),
            "navigator_layout": self.navigator.layout,
            "raw_vector_bytes": raw,
            "resident_fraction": resident / raw if raw else 0.0,
            **self.counters,
            **self.store.stats(),
            "wal_bytes": self.wal.bytes_written,
            **self.memory.stats(),
            "gathered_batches": sum(g.batches for g in self._gatherers()),
            "gathered_queries": sum(g.gathered_queries for g in self._gatherers()),
            **(self.tenancy.stats() if self.tenancy is not None else {}),
        }

    @property
    def default_max_postings(self) -> int:
        """Lists a query reads when ``SearchParams.max_postings`` is None: as measured at the
        last build, open or checkpoint (probe_rule.py), never under the sqrt rule for the heads
        there are now (heads added since by splits)."""
        return max(self.measured_postings, default_postings(self.navigator.n_heads))

    def _gatherers(self) -> list[SearchGatherer]:
        return [g for g in (self.gatherer, self.tenant_gatherer) if g is not None]

    def take_pid(self) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        return pid


def _checked_budget(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise IndexConfigError(
            f"expected None or an integer >= 0, got {value!r}", "memory_budget_bytes"
        )
    return int(value)


def _warm_up(record_element: np.dtype[Any]) -> None:
    """Compile (or load from numba's cache) the search's kernels, and import torch where the
    head scan uses it, on the scoring thread: not in the first search."""
    dot_kernel.warm_up(record_element)
    if head_scan.bfloat16_is_native():
        head_scan.warm_up()
