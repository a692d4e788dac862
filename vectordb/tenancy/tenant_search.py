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

Concurrency: runs beside other searches and one updater on the loop thread.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

import numpy as np

from vectordb.metric import distances

if TYPE_CHECKING:
    from vectordb.tenancy.tenancy import Tenancy
    from vectordb.tenancy.tenant_store import TenantStore

__all__ = ["DEFAULT_CANDIDATES", "runs_read", "tenant_search"]

DEFAULT_CANDIDATES = 1024  # vectors a query scores by default (recall vs reads: RESULTS.md)


async def tenant_search(
    tenancy: Tenancy, prepared: np.ndarray, k: int, tenants: np.ndarray, candidates: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(ids [Q, k], internal distances [Q, k]) of ``prepared`` queries (float32,
    metric.prepare) for ``tenants`` (int64 numbers, -1: a tenant with nothing)."""
    chosen = runs_read(tenancy, prepared, tenants, candidates)
    pending = _pending(tenancy, tenants)  # with ``chosen``: no await between them
    lists = [np.asarray(c, np.int64) for c in chosen] or [np.zeros(0, np.int64)]
    union = np.unique(np.concatenate(lists)).astype(np.int64)
    compact = np.zeros(len(union), bool) if candidates == 0 else tenancy.store.twins(union)
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
    ids = np.full((len(prepared), k), -1, np.int64)
    dist = np.full((len(prepared), k), np.inf, np.float32)  # padded as search pads
    for q, mine in enumerate(parts):
        keep = readable[bounds[q] : bounds[q + 1]]
        if not keep.any():
            continue
        found, found_ids, found_dist = _score(tenancy, prepared[q], mine, keep, k)
        ids[q, :found], dist[q, :found] = found_ids, found_dist
    return ids, dist


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


def _score(
    tenancy: Tenancy, query: np.ndarray, parts: list[np.ndarray], keep: np.ndarray, k: int
) -> tuple[int, np.ndarray, np.ndarray]:
    """The ``k`` nearest distinct ids among the readable records (``keep``) of ``parts``.
    Scored where they landed: a matrix product reads the records' vector fields in place
    (no copy; the few unreadable ones are scored and dropped); twins by their codes."""
    if len(parts) == 1:
        ids, dist = parts[0]["id"][keep], _distances(tenancy, query, parts[0])[keep]
    else:
        ids = np.concatenate([part["id"] for part in parts])[keep]
        dist = np.concatenate([_distances(tenancy, query, part) for part in parts])[keep]
    dist = dist.astype(np.float32, copy=False)
    if len(dist) > 2 * k:
        near = np.argpartition(dist, 2 * k)[: 2 * k]
        found = _nearest_distinct(ids[near], dist[near], k)
        if len(found[0]) == k:  # else copies of one id crowded the front: take them all
            return k, *found
    found = _nearest_distinct(ids, dist, k)
    return len(found[0]), *found


def _distances(tenancy: Tenancy, query: np.ndarray, part: np.ndarray) -> np.ndarray:
    codec = tenancy.store.codec
    if codec is not None and part.dtype == tenancy.store.codes.dtype:
        return codec.distances(codec.query_terms(query), part["vector"])
    return distances(tenancy.metric, query, part["vector"])


def _nearest_distinct(ids: np.ndarray, dist: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(dist, kind="stable")
    _, first = np.unique(ids[order], return_index=True)  # a re-granted id may sit twice
    best = order[np.sort(first)][:k]
    return ids[best], dist[best]
