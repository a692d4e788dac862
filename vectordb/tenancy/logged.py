"""The index's tenancy calls: check the input, log it, apply it (and replay it at open).

Each change is one write-ahead-log record, appended (durable) before it is applied, under the
index's update lock, so an acknowledged grant, revoke, tenant delete or insert-with-tenants
survives a crash and an unacknowledged one is replayed whole or not at all. Every check on
caller input runs before the record is written. A grant changes the access table once its
record is in; the copies into the tenant's shortlists wait (Tenancy.settle_pending).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from vectordb.config import default_postings
from vectordb.errors import IndexConfigError, InvalidTenantError
from vectordb.gather import SearchGatherer
from vectordb.metric import prepare, to_scores
from vectordb.search_result import SearchResult
from vectordb.tenancy.tenancy import Tenancy
from vectordb.tenancy.tenant_names import TenantId, check_tenant
from vectordb.tenancy.tenant_search import tenant_search
from vectordb.tenancy.wal_records import (
    DELETE_TENANT,
    GRANT,
    REVOKE,
    TENANT_INSERT,
    encode_grant,
)

if TYPE_CHECKING:
    from vectordb.config import SearchParams
    from vectordb.index import SpannIndex
    from vectordb.wal import WalRecord

__all__ = ["delete_tenant", "grant", "replay", "require", "revoke", "search"]

# tenants holding at least this share of the index take the filtered route (auto); measured
# with benchmarks/vectordb/tenancy.py (RESULTS.md)
FILTER_ROUTE_SHARE = 0.05


def require(index: SpannIndex) -> Tenancy:
    if index.tenancy is None:
        raise IndexConfigError(
            "this index was created without tenancy; create it with IndexConfig(tenancy=True)",
            "IndexConfig.tenancy",
        )
    return index.tenancy


async def grant(index: SpannIndex, ids: Any, tenant: Any) -> int:
    return await _pairs(index, GRANT, ids, tenant)


async def revoke(index: SpannIndex, ids: Any, tenant: Any) -> int:
    return await _pairs(index, REVOKE, ids, tenant)


async def _pairs(index: SpannIndex, kind: int, ids: Any, tenant: Any) -> int:
    from vectordb.updates import check_ids, maybe_checkpoint

    tenancy = require(index)
    name = check_tenant(tenant)
    ids = check_ids(ids)
    if not len(ids):
        return 0
    async with index.update_lock:
        index.check_open()
        await index.wal.append_raw(kind, len(ids), encode_grant(ids, name))
        if kind == GRANT:
            changed = await tenancy.apply_grant(ids, name)
        else:
            changed = await tenancy.apply_revoke(ids, name)
    await maybe_checkpoint(index)
    return changed


async def delete_tenant(index: SpannIndex, tenant: Any) -> int:
    from vectordb.updates import maybe_checkpoint

    tenancy = require(index)
    name = check_tenant(tenant)
    async with index.update_lock:
        index.check_open()
        await index.wal.append_raw(DELETE_TENANT, 0, encode_grant(np.zeros(0, np.int64), name))
        dropped = await tenancy.apply_delete_tenant(name)
    await maybe_checkpoint(index)
    return dropped


async def search(
    index: SpannIndex, queries: Any, k: Any, params: SearchParams, tenant: Any
) -> SearchResult:
    from vectordb.search import SMALL_BATCH_QUERIES, check_k, check_queries

    tenancy = require(index)
    prepared = prepare(index.metric, check_queries(queries, index.config.dim))
    k = check_k(k, max(tenancy.table.n_ids, 1))
    names = _query_tenants(tenant, len(prepared))
    numbers = tenancy.names.numbers(names)
    # the tenant rides with its query through the gatherer: column dim, exact in float64
    tagged = np.concatenate([prepared, numbers[:, None]], axis=1, dtype=np.float64)
    if len(tagged) <= SMALL_BATCH_QUERIES:  # concurrent small searches share one read
        if index.tenant_gatherer is None:
            run = functools.partial(_run_batch, index)
            index.tenant_gatherer = SearchGatherer(run, max_in_flight=2)
        ids, dist, skipped = await index.tenant_gatherer.search(tagged, k, params)
    else:
        ids, dist, skipped = await _run_batch(index, tagged, k, params)
    return SearchResult(ids, to_scores(index.metric, dist), skipped)  # the filtered route's


async def _run_batch(index: SpannIndex, tagged: np.ndarray, k: int, params: SearchParams) -> Any:
    """One batch of tagged queries: the tree route for small tenants, the filtered shared
    lists for large ones (``FILTER_ROUTE_SHARE``)."""
    from vectordb.search import run_batch

    tenancy = require(index)
    prepared = np.ascontiguousarray(tagged[:, :-1], np.float32)
    numbers = tagged[:, -1].astype(np.int64)
    counts = tenancy.table.counts_of(numbers)
    share = counts / max(tenancy.table.n_ids, 1)
    if params.tenant_route == "auto":  # an exact search (tenant_candidates=0) takes the tree
        filtered = (share >= FILTER_ROUTE_SHARE) & (params.tenant_candidates != 0)
    else:
        filtered = np.full(len(numbers), params.tenant_route == "filter")
    ids = np.full((len(numbers), k), -1, np.int64)
    dist = np.full((len(numbers), k), np.inf, np.float32)
    skipped = np.zeros(0, np.int64)
    if (~filtered).any():
        rows = ~filtered
        ids[rows], dist[rows] = await _tree_batch(index, prepared[rows], k, numbers[rows], params)
    if filtered.any():
        rows = filtered
        wider = _filter_params(index, params, float(share[rows].min()))
        access = (tenancy.table.member, numbers[rows])
        ids[rows], dist[rows], skipped = await run_batch(index, prepared[rows], k, wider, access)
        # a query whose lists held fewer than k vectors its tenant may read gets the tree
        wanted = np.minimum(k, counts)
        short = filtered & ((ids >= 0).sum(axis=1) < wanted)
        if short.any():
            answer = await _tree_batch(index, prepared[short], k, numbers[short], params)
            ids[short], dist[short] = answer
    return ids, dist, skipped


def _filter_params(index: SpannIndex, params: SearchParams, share: float) -> SearchParams:
    """More lists for a query whose tenant holds less of the index (about ``k / share``
    candidates must be scored to find ``k`` it may read), up to 8x the default."""
    if params.max_postings is not None:
        return params
    base = default_postings(index.navigator.n_heads)
    grow = int(min(8, max(1, round(0.1 / max(share, 1e-9)))))
    return dataclasses.replace(params, max_postings=base * grow)


async def _tree_batch(
    index: SpannIndex, prepared: np.ndarray, k: int, numbers: np.ndarray, params: SearchParams
) -> tuple[np.ndarray, np.ndarray]:
    """The tree route, registered as a reader, so a checkpoint does not hand the runs it
    reads to the allocator before it is done."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    index.searches.add(done)
    try:
        candidates = params.tenant_candidates
        return await tenant_search(require(index), prepared, k, numbers, candidates, index.scorer)
    finally:
        index.searches.discard(done)
        done.set_result(None)


def _query_tenants(tenant: Any, n: int) -> list[TenantId]:
    if isinstance(tenant, (str, int, np.integer)) and not isinstance(tenant, bool):
        return [check_tenant(tenant)] * n
    if isinstance(tenant, (bool, np.bool_, bytes, float)) or not hasattr(tenant, "__len__"):
        raise InvalidTenantError(f"tenant must be a tenant id or one per query, got {tenant!r}")
    names = [check_tenant(t) for t in tenant]
    if len(names) != n:
        raise InvalidTenantError(f"{len(names)} tenants for {n} queries")
    return names


async def replay(index: SpannIndex, record: WalRecord) -> None:
    """Apply one logged tenancy record again at open (idempotent)."""
    tenancy = require(index)
    if record.kind == TENANT_INSERT:
        from vectordb.updates import apply_insert

        assert record.vectors is not None
        fresh = ~index.versions.is_live(record.ids)
        indptr, refs, names = record.tenants
        await apply_insert(index, record.ids[fresh], record.vectors[fresh])
        new = ~tenancy.table.lookup(record.ids)[0]
        rows = _rows_subset(indptr, refs, names, new)
        await tenancy.apply_insert(record.ids[new], record.vectors[new], rows)
    elif record.kind == GRANT:
        await tenancy.apply_grant(record.ids, record.tenants)
    elif record.kind == REVOKE:
        await tenancy.apply_revoke(record.ids, record.tenants)
    elif record.kind == DELETE_TENANT:
        await tenancy.apply_delete_tenant(record.tenants)


def _rows_subset(
    indptr: np.ndarray, refs: np.ndarray, names: list[TenantId], keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[TenantId]]:
    lengths = np.diff(indptr)
    pair_keep = np.repeat(keep, lengths)
    new_indptr = np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64)
    return new_indptr, refs[pair_keep], names
