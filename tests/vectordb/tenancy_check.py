"""Shared pieces of the tenancy tests (issue 15): the access model (a plain dict of live vectors
and the tenants that may read each), and checks of an index against it.

Exact searches (``EXACT``: every shortlist, every posting list) must equal brute force over the
tenant's live vectors: the same number of results, and the same top-k scores (ids may differ only
where scores tie). Every search, exact or not, must return only ids the tenant may read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.metric import Metric, pairwise_distances, prepare, to_scores

Tenant = int | str

EVERYTHING = SearchParams(max_postings=100_000, prune_ratio=1e9)
# every shortlist and every posting list: a tenant search that must equal brute force, on
# whichever route (the tenant's shortlists, or the shared lists filtered) the index takes
EXACT = SearchParams(max_postings=100_000, prune_ratio=1e9, tenant_candidates=0)
# each route forced, exact: every shortlist of the tenant; every shared list, filtered
EXACT_TREE = SearchParams(tenant_candidates=0, tenant_route="tree")
EXACT_FILTER = SearchParams(max_postings=100_000, prune_ratio=1e9, tenant_route="filter")
EXACT_ROUTES = (EXACT, EXACT_TREE, EXACT_FILTER)
# every shortlist of the tenant, but not exact: read and scored as compact twins (tenant_store)
# where the index keeps them (ip and cosine)
ALL_TWINS = SearchParams(tenant_candidates=1 << 30, tenant_route="tree")


def small_config(**overrides: Any) -> IndexConfig:
    """A tiny tenancy index (8 dimensions, tau and leaves of 3) whose shortlists split and
    merge constantly; ``overrides`` change any field."""
    fields: dict[str, Any] = dict(
        dim=8,
        posting_limit=24,
        merge_threshold=3,
        reassign_neighbours=8,
        tenancy=True,
        shortlist_limit=3,
        tenant_leaf_size=3,
        tenant_tree_branching=3,
    )
    return IndexConfig(**{**fields, **overrides})


def norm(tenant: Any) -> Tenant:
    """A tenant as the model keys it: numpy integers become ints (5 and "5" stay apart)."""
    if isinstance(tenant, np.integer):
        return int(tenant)
    assert isinstance(tenant, int | str) and not isinstance(tenant, bool), tenant
    return tenant


def rows_of(rows: Any, n: int) -> list[set[Tenant]]:
    """Either rows form of the contract (a list of iterables, or CSR ``(indptr, tenant_ids)``)
    as one set of tenants per row."""
    if isinstance(rows, tuple):
        indptr, flat = rows
        flat = list(flat)
        return [{norm(t) for t in flat[indptr[i] : indptr[i + 1]]} for i in range(n)]
    return [{norm(t) for t in row} for row in rows]


@dataclass
class Model:
    """What the index must hold: live vectors, and for each live id the tenants reading it."""

    vectors: dict[int, np.ndarray] = field(default_factory=dict)
    access: dict[int, set[Tenant]] = field(default_factory=dict)

    def copy(self) -> Model:
        return Model(dict(self.vectors), {i: set(ts) for i, ts in self.access.items()})

    # ---------------------------------------------------------------- updates
    def insert(self, ids: Iterable[int], vectors: np.ndarray, rows: Any = None) -> None:
        ids = [int(i) for i in ids]
        tenants = [set()] * len(ids) if rows is None else rows_of(rows, len(ids))
        for i, v, ts in zip(ids, vectors, tenants, strict=True):
            assert i not in self.vectors, i
            self.vectors[i] = np.asarray(v, np.float32)
            self.access[i] = set(ts)

    def delete(self, ids: Iterable[int]) -> int:
        gone = 0
        for i in {int(i) for i in ids}:
            if i in self.vectors:
                del self.vectors[i], self.access[i]
                gone += 1
        return gone

    def grant(self, ids: Iterable[int], tenant: Any) -> int:
        tenant, new = norm(tenant), 0
        for i in {int(i) for i in ids}:
            if i in self.access and tenant not in self.access[i]:
                self.access[i].add(tenant)
                new += 1
        return new

    def revoke(self, ids: Iterable[int], tenant: Any) -> int:
        tenant, gone = norm(tenant), 0
        for i in {int(i) for i in ids}:
            if tenant in self.access.get(i, ()):
                self.access[i].discard(tenant)
                gone += 1
        return gone

    def delete_tenant(self, tenant: Any) -> int:
        tenant, gone = norm(tenant), 0
        for ts in self.access.values():
            if tenant in ts:
                ts.discard(tenant)
                gone += 1
        return gone

    def apply(self, op: tuple[Any, ...]) -> int:
        """One operation as the crash writers describe it: (kind, *arguments)."""
        kind, *args = op
        if kind == "insert":
            self.insert(*args)
            return 0
        return int(getattr(self, kind)(*args))

    # ---------------------------------------------------------------- reads
    def readable(self, tenant: Any) -> set[int]:
        tenant = norm(tenant)
        return {i for i, ts in self.access.items() if tenant in ts}

    def count(self, tenant: Any) -> int:
        return len(self.readable(tenant))

    def tenants_of(self, i: int) -> set[Tenant]:
        return set(self.access.get(int(i), ()))

    def tenants(self) -> set[Tenant]:
        return set().union(*self.access.values()) if self.access else set()

    def pairs(self) -> int:
        return sum(len(ts) for ts in self.access.values())

    def snapshot(self) -> dict[Tenant, frozenset[int]]:
        """Tenant -> the ids it may read (tenants with none are left out)."""
        out: dict[Tenant, set[int]] = {}
        for i, ts in self.access.items():
            for t in ts:
                out.setdefault(t, set()).add(i)
        return {t: frozenset(ids) for t, ids in out.items()}


def per_query(tenant: Any, n: int) -> list[Any]:
    """The tenant of each of ``n`` queries, from either form ``search`` takes."""
    if isinstance(tenant, str) or np.ndim(tenant) == 0:
        return [tenant] * n
    assert len(tenant) == n
    return list(tenant)


def true_scores(metric: Metric, queries: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Scores as SpannIndex.search reports them, of every vector for every query [Q, N]."""
    dist = pairwise_distances(metric, prepare(metric, queries), prepare(metric, vectors))
    return to_scores(metric, dist)


def assert_no_leaks(
    found: np.ndarray, tenants: Sequence[Any], allowed: Any, what: str = ""
) -> None:
    """Every returned id is readable by its query's tenant: ``allowed(tenant)`` is that set."""
    for q, (row, tenant) in enumerate(zip(found.tolist(), tenants, strict=True)):
        got = [i for i in row if i >= 0]
        leaked = set(got) - allowed(norm(tenant))
        assert not leaked, (
            f"{what}query {q}: tenant {tenant!r} got ids it may not read: {sorted(leaked)[:10]}"
        )
        assert len(set(got)) == len(got), f"{what}query {q}: duplicate ids {row}"
        assert all(i == -1 for i in row[len(got) :]), f"{what}query {q}: -1 before an id: {row}"


def assert_exact(
    metric: Metric,
    model: Model,
    queries: np.ndarray,
    k: int,
    tenant: Any,
    result: Any,
    what: str = "",
) -> None:
    """An EXACT tenant search equals brute force over each query's tenant's live vectors."""
    found, scores = result
    tenants = per_query(tenant, len(queries))
    assert found.shape == scores.shape and found.shape[0] == len(queries), found.shape
    assert found.dtype == np.int64, found.dtype
    assert_no_leaks(found, tenants, model.readable, what)
    for q, t in enumerate(tenants):
        mine = sorted(model.readable(t))
        width = min(k, len(mine))
        row = found[q]
        got = row[row >= 0]
        where = f"{what}query {q}, tenant {t!r} ({len(mine)} readable, k={k})"
        assert len(got) == width, f"{where}: {len(got)} results, want {width}: {row.tolist()}"
        if not width:
            continue
        vectors = np.stack([model.vectors[i] for i in mine])
        truth = true_scores(metric, queries[q : q + 1], vectors)[0]
        truth = np.sort(truth)[:width] if metric is Metric.L2 else -np.sort(-truth)[:width]
        position = {i: n for n, i in enumerate(mine)}
        got_scores = true_scores(metric, queries[q : q + 1], vectors)[0][
            [position[int(i)] for i in got]
        ]
        # the ids found score what the k best score (ties may swap ids, not scores) ...
        np.testing.assert_allclose(
            np.sort(got_scores), np.sort(truth), rtol=1e-4, atol=1e-3, err_msg=where
        )
        # ... and the index reports their scores
        np.testing.assert_allclose(
            scores[q, :width], got_scores, rtol=1e-3, atol=1e-3, err_msg=where
        )


async def assert_index_matches(
    index: SpannIndex,
    model: Model,
    tenants: Iterable[Any],
    ids: Iterable[int],
    what: str = "",
) -> None:
    """count, tenants_of and a whole-tenant EXACT search (k above its count) agree with the
    model for every tenant in ``tenants`` and every id in ``ids`` (live, deleted or unknown)."""
    for t in tenants:
        assert index.count(t) == model.count(t), f"{what}count({t!r})"
    for i in ids:
        got = index.tenants_of(i)
        assert isinstance(got, list), type(got)
        assert len(got) == len(set(got)), f"{what}tenants_of({i}) repeats: {got}"
        assert set(got) == model.tenants_of(i), f"{what}tenants_of({i}): {got}"
    assert index.stats()["access_pairs"] == model.pairs(), f"{what}access_pairs"
    tenants = list(tenants)
    if not tenants:
        return
    # one query per tenant, each asking for more than the tenant holds: the whole set comes back
    k = max(model.count(t) for t in tenants) + 2
    queries = np.zeros((len(tenants), index.config.dim), np.float32) + 0.5
    found, _ = await index.search(queries, k, EXACT, tenant=tenants)
    for t, row in zip(tenants, found.tolist(), strict=True):
        assert {i for i in row if i >= 0} == model.readable(t), f"{what}all of {t!r}"
    if index.tenancy is None or index.tenancy.store.codec is None:
        return
    # the same through the compact twins: every pair is in one (or pending), none leaks
    found, _ = await index.search(queries, k, ALL_TWINS, tenant=tenants)
    for t, row in zip(tenants, found.tolist(), strict=True):
        assert {i for i in row if i >= 0} == model.readable(t), f"{what}twins: all of {t!r}"
    await assert_twins_whole(index, what)


async def assert_twins_whole(index: SpannIndex, what: str = "") -> None:
    """Every shortlist run's twin holds its ids and versions, in order, and the codes of its
    vectors (tenant_store's invariant, between calls)."""
    tenancy = index.tenancy
    assert tenancy is not None and tenancy.store.codec is not None
    store, codec = tenancy.store, tenancy.store.codec
    pids = np.array(sorted(e.pid for e in tenancy.shortlists.entries()), np.int64)
    if not len(pids):
        return
    assert store.twins(pids).all(), f"{what}lists without a whole twin"
    runs, twins = await store.lists.read(pids), await store.codes.read(pids)
    assert np.array_equal(runs.starts, twins.starts), f"{what}twin lengths"
    assert np.array_equal(runs.records["id"], twins.records["id"]), f"{what}twin ids"
    assert np.array_equal(runs.records["version"], twins.records["version"]), what
    codes = codec.encode(runs.records["vector"])
    assert np.array_equal(codes, twins.records["vector"]), f"{what}twin codes"
