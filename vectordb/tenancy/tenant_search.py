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
(their error is the codec's step: ~1e-3 on unit vectors). Every record is then checked
against the access table *after* its read landed (one compiled pass for the batch, or for
each read group): only pairs the query's tenant holds at that moment, at the vector's
current location, each id once; so a grant or revoke racing the search is never answered
wrongly, whatever the runs hold. The records' ids, the check and the scoring with each
query's top k are compiled passes (tenant_batch, tenant_kernels): no Python per query.
Where the batch is one read (twins, or runs for an exact search) with no pending grants, its
groups are taken as each lands: checked (posting_format), access-checked and scored while
the other groups are still in flight, so the CPU work hides behind the reads (ties between
equal distances of two ids then go by landing order).

Pending grants (pending_grants: acknowledged, not yet copied into shortlists) of a query's
tenant are scored from their home copies, read in the same go as the shortlists; the pending
ids are taken with the shortlists, before any await, so every pair acknowledged when the
search started is in one or the other (a pair being settled may be in both: one result an id).

Concurrency: runs beside other searches and one updater on the loop thread; with a
``scorer`` executor, half of a large batch taken at once is scored on it (over the batch's
own buffers and arrays: nothing shared with other calls) while the loop thread scores the
other half.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from contextlib import aclosing
from typing import TYPE_CHECKING

import numpy as np

from vectordb.tenancy.tenant_batch import RUNS, TWINS, TenantBatch
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
    # both reads submitted now, not at the first await (the directories as of this loop
    # turn: see TenantStore.start_views)
    groups = max(1, min(_READ_GROUPS, len(union) // _LISTS_A_GROUP))
    runs = store.begin_runs(union[~compact], groups) if not compact.all() else None
    twins = store.begin_twins(union[compact], groups) if compact.any() else None
    home = _read_pending(tenancy, pending)
    batch = TenantBatch(tenancy, prepared, tenants, k)
    batch.lay_out(compact, runs, twins, ptr, np.searchsorted(union, chosen))
    batch.prepare_scoring(codec if compact.any() else None)
    one = runs if twins is None else twins if runs is None else None
    if one is not None and home is None and batch.dtype["vector"].base != np.float16:
        await _as_landing(batch, one)  # one read: each group scored as it lands
        return batch.ids, batch.dist
    for read, source in ((runs, RUNS), (twins, TWINS)):
        if read is not None:
            await _landed(read)
            batch.widen(source, read.buffer)
    if home is not None:
        batch.add_pending(await home, pending)
    await _all_at_once(batch, scorer)
    return batch.ids, batch.dist


async def _as_landing(batch: TenantBatch, read: PostingRead) -> None:
    """Score each group's parts once its read has landed (checked) while the other groups are
    still in flight (the entries are the read's lists, in its order)."""
    order = np.argsort(batch.part_of, kind="stable")
    sorted_of = batch.part_of[order]
    async with aclosing(read.groups()) as groups:
        async for first, stop in groups:
            a, b = np.searchsorted(sorted_of, [first, stop]).tolist()
            if a < b:
                parts = order[a:b]
                batch.score(parts, *batch.take(parts))


async def _all_at_once(batch: TenantBatch, scorer: Executor | None) -> None:
    """Every part checked in one pass, then scored: half the queries on ``scorer``."""
    parts = np.arange(len(batch.part_of))
    ids, readable = batch.take(parts)
    n = len(batch.queries)
    if scorer is None or n < _SPLIT_QUERIES:
        batch.score(parts, ids, readable)
        return
    cut = int(batch.part_ptr[n // 2])  # parts are in query order: two sets of queries
    at = int(batch.u_cnt[batch.part_of[:cut]].sum())
    loop = asyncio.get_running_loop()
    other = loop.run_in_executor(scorer, batch.score, parts[cut:], ids[at:], readable[at:])
    try:
        batch.score(parts[:cut], ids[:at], readable[:at])
    finally:
        await other


async def _landed(read: PostingRead) -> None:
    async with aclosing(read.groups()) as groups:
        async for _ in groups:
            pass


def runs_read(
    tenancy: Tenancy, prepared: np.ndarray, tenants: np.ndarray, candidates: int | None
) -> list[list[int]]:
    """The shortlist runs (pids, nearest first) each query's search reads (the tenancy
    benchmark times reading just these, cold: the floor of a search of these queries)."""
    budget = DEFAULT_CANDIDATES if candidates is None else candidates
    ptr, chosen = choose(tenancy, prepared, np.asarray(tenants, np.int64), budget)
    bounds = zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True)
    return [chosen[a:b].tolist() for a, b in bounds]


def _pending(tenancy: Tenancy, tenants: np.ndarray) -> dict[int, np.ndarray]:
    """Pending granted ids of each of the batch's tenants that has some."""
    if not tenancy.pending:
        return {}
    out = {t: tenancy.pending.ids(t) for t in np.unique(tenants).tolist() if t >= 0}
    return {t: ids for t, ids in out.items() if len(ids)}


def _read_pending(
    tenancy: Tenancy, pending: dict[int, np.ndarray]
) -> asyncio.Future[np.ndarray] | None:
    """The home records of the pending ids, read now (a home record that holds another id
    than the one asked for is dropped); None without pending ids."""
    if not pending:
        return None
    wanted = np.unique(np.concatenate(list(pending.values())))
    held, locations, _ = tenancy.table.lookup(wanted)
    wanted, locations = wanted[held], locations[held]

    async def records() -> np.ndarray:
        found = await tenancy.store.read_home_records(wanted, locations)  # home copies stay
        return found[found["id"] == wanted]

    return asyncio.ensure_future(records())
