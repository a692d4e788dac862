"""The compiled passes of a tenant search batch (vectordb.tenancy.tenant_kernels, issue 15).

- the top-k insertion keeps what a stable sort by distance then the first copy of each id
  keeps (ties: the earlier record; a repeated id counts once, at its nearest copy);
- the batched tree walk (tenant_walk.choose) reads the shortlists a per-query heap walk
  reads, in the same order, for budgets from one vector to all of them;
- exact searches of float16 and uint8 tenancy indexes (records the kernels read widened or as
  bytes) equal brute force over each tenant's stored vectors.
"""

from __future__ import annotations

import asyncio
import heapq
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectordb.helpers import clustered
from tests.vectordb.tenancy_check import EXACT, small_config
from vectordb import SpannIndex
from vectordb.metric import prepare
from vectordb.tenancy.tenancy import Tenancy
from vectordb.tenancy.tenant_kernels import _offer
from vectordb.tenancy.tenant_search import runs_read

TENANTS = ["a", "b", "c", 4, 5]


@settings(max_examples=200, deadline=None)
@given(
    pairs=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 6)), max_size=60),
    k=st.integers(1, 8),
)
def test_top_k_keeps_the_first_copy_in_stable_order(pairs: list[tuple[int, int]], k: int) -> None:
    ids = np.array([p[0] for p in pairs], np.int64)
    dist = np.array([p[1] for p in pairs], np.float32) / 4  # few values: many ties
    top_id, top_d = np.full(k, -1, np.int64), np.full(k, np.inf, np.float32)
    n = 0
    for vid, d in zip(ids.tolist(), dist.tolist(), strict=True):
        n = _offer(top_id, top_d, n, k, vid, np.float32(d))
    order = np.argsort(dist, kind="stable")
    seen: list[int] = []
    for i in order.tolist():
        if int(ids[i]) not in seen:
            seen.append(int(ids[i]))
    want = seen[:k]
    assert n == len(want)
    assert top_id[:n].tolist() == want
    assert top_d[:n].tolist() == [float(dist[ids == v].min()) for v in want]
    assert (top_id[n:] == -1).all() and np.isinf(top_d[n:]).all()


def _heap_walk(tenancy: Tenancy, query: np.ndarray, tenant: int, budget: int) -> list[int]:
    """The per-query walk the batched one replaced (the model)."""
    shortlists = tenancy.shortlists.view(tenant)
    if not shortlists:
        return []
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
        for child in tenancy.tree.children(node):
            if child in shortlists:
                diff = tenancy.tree.centroids[child].astype(np.float32) - query
                heapq.heappush(heap, (float(diff @ diff), child))
    return taken


def test_batched_walk_reads_what_a_heap_walk_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    vectors = clustered(900, 8, seed=5)
    rows = [[t for t in TENANTS if rng.random() < 0.5] for _ in range(len(vectors))]

    async def main() -> None:
        index = await SpannIndex.create(tmp_path / "idx", small_config())
        await index.build(None, vectors, tenants=rows)
        tenancy = index.tenancy
        assert tenancy is not None
        queries = prepare(index.metric, clustered(40, 8, seed=6))
        numbers = tenancy.names.numbers([TENANTS[i % len(TENANTS)] for i in range(40)])
        assert max(len(tenancy.shortlists.view(int(t)) or {}) for t in numbers) > 20
        for budget in (1, 3, 10, 50, 0):
            got = runs_read(tenancy, queries, numbers, budget)
            want = [
                _heap_walk(tenancy, q, int(t), budget)
                for q, t in zip(queries, numbers, strict=True)
            ]
            assert got == want, budget
        await index.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("dtype", ["float16", "uint8"])
def test_exact_search_of_narrow_dtypes_is_brute_force(tmp_path: Path, dtype: str) -> None:
    rng = np.random.default_rng(7)
    raw = clustered(400, 8, seed=7)
    if dtype == "uint8":
        raw = np.clip(raw * 40 + 128, 0, 255).round()
    stored = raw.astype(dtype).astype(np.float32)
    rows = [[t for t in TENANTS if rng.random() < 0.4] for _ in range(len(raw))]
    queries = stored[:12] + rng.normal(0, 0.5, (12, 8)).astype(np.float32)

    async def main() -> None:
        config = small_config(dtype=dtype, metric="l2")
        index = await SpannIndex.create(tmp_path / dtype, config)
        await index.build(None, raw.astype(dtype), tenants=rows)
        for tenant in TENANTS:
            found, scores = await index.search(queries, 5, EXACT, tenant=tenant)
            mine = np.array([i for i, row in enumerate(rows) if tenant in row])
            for q in range(len(queries)):
                dist = ((stored[mine] - queries[q]) ** 2).sum(axis=1)
                want = np.sort(dist)[:5]
                got = found[q][found[q] >= 0]
                assert set(got.tolist()) <= set(mine.tolist())
                np.testing.assert_allclose(scores[q, : len(got)], want, rtol=1e-4, atol=1e-3)
        await index.aclose()

    asyncio.run(main())
