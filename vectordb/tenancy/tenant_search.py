"""Tenant search: each query reads its tenant's nearest shortlists and scores them exactly.

Per query (one tenant each), best-first over the tenant's own tree (Curator): from the root,
pop the node nearest the query (squared L2 to its centroid, in the prepared space); a shortlist
is taken whole, an internal node's children that the tenant has are pushed; stop once the
shortlists taken hold ``tenant_candidates`` vectors (0: take them all, an exact search). A
tenant of at most ``shortlist_limit`` vectors is one shortlist: one read.

The shortlists of the whole batch are read in one submission (a list two queries need is read
once). Every record is then checked against the access table *after* the reads land: only
pairs the query's tenant holds at that moment, at the vector's current location, each id once;
so a grant or revoke racing the search is never answered wrongly, whatever the runs hold.

Concurrency: runs beside other searches and one updater on the loop thread.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from vectordb.metric import distances

if TYPE_CHECKING:
    from vectordb.tenancy.tenancy import Tenancy

__all__ = ["DEFAULT_CANDIDATES", "tenant_search"]

DEFAULT_CANDIDATES = 1024  # vectors a query scores by default (recall vs reads: RESULTS.md)


async def tenant_search(
    tenancy: Tenancy, prepared: np.ndarray, k: int, tenants: np.ndarray, candidates: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(ids [Q, k], internal distances [Q, k]) of ``prepared`` queries (float32,
    metric.prepare) for ``tenants`` (int64 numbers, -1: a tenant with nothing)."""
    budget = DEFAULT_CANDIDATES if candidates is None else candidates
    chosen = [_choose(tenancy, q, int(t), budget) for q, t in zip(prepared, tenants, strict=True)]
    chosen = [_written(tenancy, c) for c in chosen]
    lists = [np.asarray(c, np.int64) for c in chosen] or [np.zeros(0, np.int64)]
    union = np.unique(np.concatenate(lists)).astype(np.int64)
    batch = await tenancy.store.read(union) if len(union) else None
    ids = np.full((len(prepared), k), -1, np.int64)
    dist = np.full((len(prepared), k), np.inf, np.float32)  # padded as search pads
    for q, pids in enumerate(chosen):
        if batch is None or not pids:
            continue
        at = np.searchsorted(union, pids).tolist()
        parts = [batch.records[batch.starts[i] : batch.starts[i + 1]] for i in at]
        records = parts[0] if len(parts) == 1 else np.concatenate(parts)
        found, found_ids, found_dist = _score(tenancy, prepared[q], records, int(tenants[q]), k)
        ids[q, :found], dist[q, :found] = found_ids, found_dist
    return ids, dist


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
    tenancy: Tenancy, query: np.ndarray, records: np.ndarray, tenant: int, k: int
) -> tuple[int, np.ndarray, np.ndarray]:
    keep = tenancy.table.readable(records["id"], records["version"], tenant)
    if not keep.any():
        return 0, np.zeros(0, np.int64), np.zeros(0, np.float32)
    ids = records["id"][keep]
    vectors = np.ascontiguousarray(records["vector"][keep], np.float32)
    dist = distances(tenancy.metric, query, vectors)
    if len(dist) > 2 * k:
        near = np.argpartition(dist, 2 * k)[: 2 * k]
        found = _nearest_distinct(ids[near], dist[near], k)
        if len(found[0]) == k:  # else copies of one id crowded the front: take them all
            return k, *found
    found = _nearest_distinct(ids, dist, k)
    return len(found[0]), *found


def _nearest_distinct(ids: np.ndarray, dist: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(dist, kind="stable")
    _, first = np.unique(ids[order], return_index=True)  # a re-granted id may sit twice
    best = order[np.sort(first)][:k]
    return ids[best], dist[best]
