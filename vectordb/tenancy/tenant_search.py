"""Tenant search: each query reads its tenant's nearest shortlists and scores them exactly.

Per query (one tenant each), best-first over the tenant's own tree (Curator: tenant_walk,
one compiled walk for the batch); stop once the shortlists taken hold ``tenant_candidates``
vectors (0: take them all, an exact search). A tenant of at most ``shortlist_limit`` vectors
is one shortlist: one read.

The shortlists of the whole batch are read in one submission (a list two queries need is read
once) and scored where they landed (no record is copied). A shortlist whose compact twin is
whole (tenant_store: a byte a dimension, a quarter of the bytes) is read and scored as the
twin (sq8: one product of the codes with the scaled query), unless the search is exact
(``tenant_candidates=0``: the runs themselves); distances of twins are those of the codes
(their error is the codec's step: ~1e-3 on unit vectors). Every record of the batch is then
checked against the access table, in one pass, *after* the reads land: only pairs the
query's tenant holds at that moment, at the vector's current location, each id once; so a
grant or revoke racing the search is never answered wrongly, whatever the runs hold. The
records' ids, the scoring and each query's top k run as compiled passes over the whole batch
(tenant_kernels): no Python per query.

Pending grants (pending_grants: acknowledged, not yet copied into shortlists) of a query's
tenant are scored from their home copies, read in the same go as the shortlists; the pending
ids are taken with the shortlists, before any await, so every pair acknowledged when the
search started is in one or the other (a pair being settled may be in both: one result an id).

Concurrency: runs beside other searches and one updater on the loop thread; with a
``scorer`` executor, half of a large batch is scored on it (over the batch's own buffers and
arrays: nothing shared with other calls) while the loop thread scores the other half.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import numpy as np

from vectordb.metric import Metric
from vectordb.tenancy import tenant_kernels
from vectordb.tenancy.tenant_walk import choose

if TYPE_CHECKING:
    from vectordb.posting_reads import PostingRead
    from vectordb.tenancy.tenancy import Tenancy

__all__ = ["DEFAULT_CANDIDATES", "runs_read", "tenant_search"]

DEFAULT_CANDIDATES = 1024  # vectors a query scores by default (recall vs reads: RESULTS.md)
_SPLIT_QUERIES = 32  # a batch of at least this many queries is scored on two threads
# a batch's reads go in up to this many groups, each checked (posting_format) as it lands
# while the others are in flight (one group: the whole check came after the last read)
_READ_GROUPS = 8
_LISTS_A_GROUP = 16
_NO_WORDS = np.zeros(1, np.uint64)
_RUNS, _TWINS, _PENDING = 0, 1, 2  # where a part's records are (tenant_kernels' sources)


async def tenant_search(
    tenancy: Tenancy,
    prepared: np.ndarray,
    k: int,
    tenants: np.ndarray,
    candidates: int | None,
    scorer: Executor | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(ids [Q, k], internal distances [Q, k]) of ``prepared`` queries (float32,
    metric.prepare) for ``tenants`` (int64 numbers, -1: a tenant with nothing). ``scorer``:
    an executor that scores half of a large batch beside the loop thread."""
    tenants = np.asarray(tenants, np.int64)
    budget = DEFAULT_CANDIDATES if candidates is None else candidates
    ptr, chosen = choose(tenancy, prepared, tenants, budget)
    pending = _pending(tenancy, tenants)  # with ``chosen``: no await between them
    union = np.unique(chosen)
    store = tenancy.store
    compact = np.zeros(len(union), bool) if candidates == 0 else store.twins(union)
    codec = store.codec  # the codec of the twins read now (a retrain replaces it)
    runs, twins, records = await _read(tenancy, union, compact, pending)
    batch = _Batch(tenancy, prepared, tenants, k)
    batch.lay_out(union, compact, runs, twins, ptr, np.searchsorted(union, chosen))
    batch.add_pending(records, pending)
    batch.check()  # one access check for every record of every query (after the reads landed)
    batch.prepare_scoring(codec if compact.any() else None)
    half = len(prepared) // 2
    if scorer is None or len(prepared) < _SPLIT_QUERIES:
        batch.rows(0, len(prepared))
        return batch.ids, batch.dist
    other = asyncio.get_running_loop().run_in_executor(scorer, batch.rows, half, len(prepared))
    try:
        batch.rows(0, half)
    finally:
        await other
    return batch.ids, batch.dist


def runs_read(
    tenancy: Tenancy, prepared: np.ndarray, tenants: np.ndarray, candidates: int | None
) -> list[list[int]]:
    """The shortlist runs (pids, nearest first) each query's search reads (the tenancy
    benchmark times reading just these, cold: the floor of a search of these queries)."""
    budget = DEFAULT_CANDIDATES if candidates is None else candidates
    ptr, chosen = choose(tenancy, prepared, np.asarray(tenants, np.int64), budget)
    return [chosen[a:b].tolist() for a, b in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True)]


def _pending(tenancy: Tenancy, tenants: np.ndarray) -> dict[int, np.ndarray]:
    """Pending granted ids of each of the batch's tenants that has some."""
    if not tenancy.pending:
        return {}
    out = {t: tenancy.pending.ids(t) for t in np.unique(tenants).tolist() if t >= 0}
    return {t: ids for t, ids in out.items() if len(ids)}


async def _read(
    tenancy: Tenancy, pids: np.ndarray, compact: np.ndarray, pending: dict[int, np.ndarray]
) -> tuple[PostingRead | None, PostingRead | None, np.ndarray]:
    """(the runs of ``pids`` not ``compact``, the twins of those that are, each landed
    whole; the home records of the pending ids), read at once; a home record that holds
    another id than the one asked for is dropped. Both reads are submitted now, not at the
    first await (the directories as of this loop turn: see TenantStore.start_views)."""
    store = tenancy.store
    waits: list[Awaitable[Any]] = []
    groups = max(1, min(_READ_GROUPS, len(pids) // _LISTS_A_GROUP))
    if not compact.all():
        waits.append(store.start_run_read(pids[~compact], groups))
    if compact.any():
        waits.append(store.start_twin_read(pids[compact], groups))
    wanted = np.zeros(0, np.int64)
    if pending:
        wanted = np.unique(np.concatenate(list(pending.values())))
        held, locations, _ = tenancy.table.lookup(wanted)
        wanted, locations = wanted[held], locations[held]
        waits.append(store.read_home_records(wanted, locations))  # home copies stay put
    landed = list(await asyncio.gather(*waits))
    runs = landed.pop(0) if not compact.all() else None
    twins = landed.pop(0) if compact.any() else None
    records = landed.pop(0) if pending else np.zeros(0, store.lists.dtype)
    return runs, twins, records[records["id"] == wanted] if pending else records


class _Batch:
    """The arrays tenant_kernels take for one batch: each query's parts (CSR over entries
    of (source, byte offset, records)), the sources' buffers, the records' access mask; and
    the answer (``rows``: a range of queries; two ranges may run on two threads)."""

    def __init__(self, tenancy: Tenancy, prepared: np.ndarray, tenants: np.ndarray, k: int):
        self.tenancy, self.prepared, self.tenants = tenancy, prepared, tenants
        self.dtype = tenancy.store.lists.dtype
        self.ids = np.full((len(prepared), k), -1, np.int64)
        self.dist = np.full((len(prepared), k), np.inf, np.float32)  # padded as search pads
        element = self.dtype["vector"].base
        empty = np.zeros(0, np.float32 if element == np.float16 else element)
        self.words = [_NO_WORDS, _NO_WORDS, _NO_WORDS]
        self.values = [empty, np.zeros(0, np.uint8), empty]
        codes_bytes = tenancy.store.codes.rec_bytes
        self.rec_bytes = np.array([self.dtype.itemsize, codes_bytes, self.dtype.itemsize])

    def lay_out(
        self, union: np.ndarray, compact: np.ndarray, runs: PostingRead | None,
        twins: PostingRead | None, ptr: np.ndarray, part_of: np.ndarray,
    ) -> None:  # fmt: skip
        self.u_src = np.where(compact, _TWINS, _RUNS).astype(np.int64)
        self.u_off = np.zeros(len(union), np.int64)
        self.u_cnt = np.zeros(len(union), np.int64)
        for source, read, where in ((_RUNS, runs, ~compact), (_TWINS, twins, compact)):
            if read is not None:
                self.u_off[where], self.u_cnt[where] = read.byte_offsets, read.counts
                self._source(source, read.buffer)
        self.part_ptr, self.part_of = ptr.astype(np.int64), part_of.astype(np.int64)

    def _source(self, source: int, raw: np.ndarray) -> None:
        self.words[source] = raw.view(np.uint64)
        if source == _TWINS:
            self.values[source] = raw
            return
        element = self.dtype["vector"].base
        values = raw.view(element)  # float16: widened in place of (numba has no float16)
        self.values[source] = values.astype(np.float32) if element == np.float16 else values

    def add_pending(self, records: np.ndarray, pending: dict[int, np.ndarray]) -> None:
        """One more part per tenant with pending grants: its home copies, after its
        shortlists, for each of its queries."""
        if not pending:
            return
        theirs = [
            records[np.isin(records["id"], ids, assume_unique=True)] for ids in pending.values()
        ]
        counts = np.array([len(r) for r in theirs], np.int64)
        raw = np.ascontiguousarray(np.concatenate(theirs)).view(np.uint8)
        self._source(_PENDING, np.concatenate([raw, np.zeros(8, np.uint8)]))
        first = len(self.u_src)
        self.u_src = np.concatenate([self.u_src, np.full(len(theirs), _PENDING)])
        starts = (np.cumsum(counts) - counts) * self.dtype.itemsize
        self.u_off = np.concatenate([self.u_off, starts])
        self.u_cnt = np.concatenate([self.u_cnt, counts])
        extra = np.full(len(self.tenants), -1, np.int64)
        for i, tenant in enumerate(pending):
            extra[self.tenants == tenant] = first + i
        has = extra >= 0
        self.part_of = np.insert(self.part_of, self.part_ptr[1:][has], extra[has])
        self.part_ptr = self.part_ptr + np.concatenate([[0], np.cumsum(has)])

    def check(self) -> None:
        """Every record's id, and whether its query's tenant may read it now."""
        part_counts = self.u_cnt[self.part_of]
        self.rec_ptr = np.concatenate([[0], np.cumsum(part_counts)])[self.part_ptr]
        total = int(self.rec_ptr[-1])
        self.rec_ids = np.empty(total, np.int64)
        versions = np.empty(total, np.uint32)
        words = self.words
        tenant_kernels.gather(
            self.part_ptr, self.part_of, self.u_src, self.u_off, self.u_cnt, words[_RUNS],
            words[_TWINS], words[_PENDING], self.rec_bytes, self.rec_ids, versions,
        )  # fmt: skip
        owners = np.repeat(self.tenants, np.diff(self.rec_ptr))
        self.readable = self.tenancy.table.readable_by(self.rec_ids, versions, owners)

    def prepare_scoring(self, codec: Any) -> None:
        queries = np.ascontiguousarray(self.prepared, np.float32)
        self.queries = queries
        if codec is None:
            self.scaled, self.bias = queries[:0], np.zeros(0, np.float32)
        else:
            self.scaled = np.ascontiguousarray(queries * codec.step, np.float32)
            self.bias = (queries @ codec.low).astype(np.float32)

    def rows(self, first: int, stop: int) -> None:
        tenant_kernels.score(
            first, stop, self.part_ptr, self.part_of, self.u_src, self.u_off, self.u_cnt,
            self.rec_ptr, self.readable, self.rec_ids, self.values[_RUNS],
            self.values[_PENDING], self.dtype["vector"].base.itemsize, self.values[_TWINS],
            self.rec_bytes, self.queries, self.scaled, self.bias,
            self.tenancy.metric is Metric.L2, self.ids, self.dist,
        )  # fmt: skip
