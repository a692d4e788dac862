"""Tenant search: each query reads its tenant's nearest shortlists and scores them exactly.

Per query (one tenant each), best-first over the tenant's own tree (Curator): from the root,
pop the node nearest the query (squared L2 to its centroid, in the prepared space); a shortlist
is taken whole, an internal node's children that the tenant has are pushed; stop once the
shortlists taken hold ``tenant_candidates`` vectors (0: take them all, an exact search). A
tenant of at most ``shortlist_limit`` vectors is one shortlist: one read.

The shortlists of the whole batch are read in one submission (a list two queries need is read
once) into one buffer, and scored where they landed (no record is copied). A shortlist whose
compact twin is whole (tenant_store: a byte a dimension, a quarter of the bytes) is read and
scored as the twin (sq8: one product of the codes with the scaled query), unless the search
is exact (``tenant_candidates=0``: the runs themselves); distances of twins are those of the
codes (their error is the codec's step: ~1e-3 on unit vectors). Every record of
the batch is then checked against the access table, in one pass, *after* the reads land: only
pairs the query's tenant holds at that moment, at the vector's current location, each id once;
so a grant or revoke racing the search is never answered wrongly, whatever the runs hold.

Pending grants (pending_grants: acknowledged, not yet copied into shortlists) of a query's
tenant are scored from their home copies, read in the same go as the shortlists; the pending
ids are taken with the shortlists, before any await, so every pair acknowledged when the
search started is in one or the other (a pair being settled may be in both: one result an id).

Concurrency: runs beside other searches and one updater on the loop thread; with a
``scorer`` executor, half of a large batch is scored on it (over the batch's own buffer and
arrays: nothing shared with other calls) while the loop thread scores the other half.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import numpy as np

from vectordb.metric import Metric, distances
from vectordb.tenancy.sq8 import Sq8Codec

if TYPE_CHECKING:
    from vectordb.tenancy.tenancy import Tenancy
    from vectordb.tenancy.tenant_store import TenantStore

__all__ = ["DEFAULT_CANDIDATES", "runs_read", "tenant_search"]

DEFAULT_CANDIDATES = 1024  # vectors a query scores by default (recall vs reads: RESULTS.md)
_SPLIT_QUERIES = 32  # a batch of at least this many queries is scored on two threads


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
    chosen = runs_read(tenancy, prepared, tenants, candidates)
    pending = _pending(tenancy, tenants)  # with ``chosen``: no await between them
    lists = [np.asarray(c, np.int64) for c in chosen] or [np.zeros(0, np.int64)]
    union = np.unique(np.concatenate(lists)).astype(np.int64)
    compact = np.zeros(len(union), bool) if candidates == 0 else tenancy.store.twins(union)
    codec = tenancy.store.codec  # the codec of the twins read now (a retrain replaces it)
    views, records = await _read(tenancy, union, compact, pending)
    parts = [[views[i] for i in np.searchsorted(union, p).tolist()] for p in chosen]
    for tenant, pending_ids in pending.items():
        theirs = records[np.isin(records["id"], pending_ids, assume_unique=True)]
        for q in np.flatnonzero(tenants == tenant).tolist():
            parts[q].append(theirs)
    # one access check for every record of every query (after the reads landed)
    lengths = [sum(len(v) for v in mine) for mine in parts]
    bounds = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    readable = np.zeros(0, bool)
    if bounds[-1]:
        readable = tenancy.table.readable_by(
            np.concatenate([v["id"] for mine in parts for v in mine]),
            np.concatenate([v["version"] for mine in parts for v in mine]),
            np.repeat(tenants, lengths),
        )
    out = _Scored(tenancy.metric, codec, prepared, parts, readable, bounds, k)
    half = len(prepared) // 2
    if scorer is None or len(prepared) < _SPLIT_QUERIES:
        out.rows(0, len(prepared))
        return out.ids, out.dist
    other = asyncio.get_running_loop().run_in_executor(scorer, out.rows, half, len(prepared))
    try:
        out.rows(0, half)
    finally:
        await other
    return out.ids, out.dist


def runs_read(
    tenancy: Tenancy, prepared: np.ndarray, tenants: np.ndarray, candidates: int | None
) -> list[list[int]]:
    """The shortlist runs (pids, nearest first) each query's search reads (the tenancy
    benchmark times reading just these, cold: the floor of a search of these queries)."""
    budget = DEFAULT_CANDIDATES if candidates is None else candidates
    pairs = zip(prepared, tenants, strict=True)
    return [_written(tenancy, _choose(tenancy, q, int(t), budget)) for q, t in pairs]


def _pending(tenancy: Tenancy, tenants: np.ndarray) -> dict[int, np.ndarray]:
    """Pending granted ids of each of the batch's tenants that has some."""
    if not tenancy.pending:
        return {}
    out = {t: tenancy.pending.ids(t) for t in np.unique(tenants).tolist() if t >= 0}
    return {t: ids for t, ids in out.items() if len(ids)}


async def _read(
    tenancy: Tenancy, pids: np.ndarray, compact: np.ndarray, pending: dict[int, np.ndarray]
) -> tuple[list[np.ndarray], np.ndarray]:
    """(a view of each shortlist run of ``pids``, its twin where ``compact``; the home
    records of the pending ids), read at once; a home record that holds another id than the
    one asked for is dropped."""
    store = tenancy.store
    views = _start(store, pids, compact) if len(pids) else None  # now: see start_views
    records = np.zeros(0, store.lists.dtype)
    if pending:
        wanted = np.unique(np.concatenate(list(pending.values())))
        held, locations, _ = tenancy.table.lookup(wanted)
        wanted, locations = wanted[held], locations[held]
        home = store.read_home_records(wanted, locations)  # home copies stay where they are
        if views is None:
            records = await home
            return [], records[records["id"] == wanted]
        landed, records = await asyncio.gather(views, home)
        return landed, records[records["id"] == wanted]
    return (await views if views is not None else []), records


def _start(store: TenantStore, pids: np.ndarray, compact: np.ndarray) -> Awaitable[list[Any]]:
    """Both reads submitted now, not at the caller's first await (the directories as of this
    loop turn: see TenantStore.start_views)."""
    runs = store.start_views(pids[~compact]) if not compact.all() else None
    twins = store.start_twin_views(pids[compact]) if compact.any() else None

    async def landed() -> list[np.ndarray]:
        landed_runs = await runs if runs is not None else []
        if twins is None:
            return landed_runs
        runs_at, twins_at = iter(landed_runs), iter(await twins)
        return [next(twins_at) if t else next(runs_at) for t in compact.tolist()]

    return landed()


def _written(tenancy: Tenancy, pids: list[int]) -> list[int]:
    """Drop shortlists whose first run is still being written (a grant not yet acknowledged:
    its pairs are not visible yet)."""
    capacity = tenancy.store.lists.capacity
    return [p for p in pids if p < len(capacity) and capacity[p] > 0]


def _choose(tenancy: Tenancy, query: np.ndarray, tenant: int, budget: int) -> list[int]:
    """The pids of the shortlists ``query`` reads, nearest first."""
    if tenant < 0:
        return []
    root = tenancy.shortlists.root(tenant)
    if root is not None:
        return [root.pid]
    shortlists = tenancy.shortlists.view(tenant)
    if not shortlists:
        return []
    tree = tenancy.tree
    heap: list[tuple[float, int]] = [(0.0, 0)]
    taken: list[int] = []
    held = 0
    while heap and (budget == 0 or held < budget):
        _, node = heapq.heappop(heap)
        entry = shortlists[node]
        if entry is not None:
            taken.append(entry.pid)
            held += entry.live
            continue
        kids = [c for c in tree.children(node) if c in shortlists]
        centres = tree.centroids[kids].astype(np.float32)
        diff = centres - query
        for child, dist in zip(kids, np.einsum("ij,ij->i", diff, diff).tolist(), strict=True):
            heapq.heappush(heap, (dist, child))
    return taken


class _Scored:
    """Each query's ``k`` nearest distinct readable ids among its parts (``rows``: a range of
    queries; two ranges may run on two threads: each writes its own rows). Records are
    scored where they landed: a matrix product over the vector fields in place, twins by
    their codes (``codec``: the one they were read under)."""

    def __init__(
        self, metric: Metric, codec: Sq8Codec | None, prepared: np.ndarray,
        parts: list[list[np.ndarray]], readable: np.ndarray, bounds: list[int], k: int,
    ) -> None:  # fmt: skip
        self.metric, self.codec, self.prepared = metric, codec, prepared
        self.parts, self.readable, self.bounds, self.k = parts, readable, bounds, k
        self.ids = np.full((len(prepared), k), -1, np.int64)
        self.dist = np.full((len(prepared), k), np.inf, np.float32)  # padded as search pads

    def rows(self, first: int, stop: int) -> None:
        k, codec, bounds = self.k, self.codec, self.bounds
        for q in range(first, stop):
            keep = self.readable[bounds[q] : bounds[q + 1]]
            if not keep.any():
                continue
            query, mine = self.prepared[q], self.parts[q]
            terms = codec.query_terms(query) if codec is not None else None
            scored = [self._distances(query, terms, part) for part in mine]
            if len(mine) == 1:
                ids, dist = mine[0]["id"][keep], scored[0][keep]
            else:
                ids = np.concatenate([part["id"] for part in mine])[keep]
                dist = np.concatenate(scored)[keep]
            found_ids, found_dist = _nearest(ids, dist, k)
            self.ids[q, : len(found_ids)], self.dist[q, : len(found_ids)] = found_ids, found_dist

    def _distances(
        self, query: np.ndarray, terms: tuple[np.ndarray, float] | None, part: np.ndarray
    ) -> np.ndarray:
        if terms is not None and part.dtype["vector"].base == np.uint8:
            assert self.codec is not None
            return self.codec.distances(terms, part["vector"])
        return distances(self.metric, query, part["vector"]).astype(np.float32, copy=False)


def _nearest(ids: np.ndarray, dist: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` nearest distinct ids (a re-granted id may sit twice: pending and placed, or
    a stale and a new record of one run)."""
    if len(dist) > 2 * k:
        near = np.argpartition(dist, 2 * k)[: 2 * k]
        order = near[np.argsort(dist[near], kind="stable")]
        top = ids[order].tolist()
        if len(set(top)) == len(top):  # no copies among the 2k nearest: the first k
            return ids[order[:k]], dist[order[:k]]
        found = _nearest_distinct(ids[near], dist[near], k)
        if len(found[0]) == k:  # else copies of one id crowded the front: take them all
            return found
    return _nearest_distinct(ids, dist, k)


def _nearest_distinct(ids: np.ndarray, dist: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(dist, kind="stable")
    _, first = np.unique(ids[order], return_index=True)  # a re-granted id may sit twice
    best = order[np.sort(first)][:k]
    return ids[best], dist[best]
