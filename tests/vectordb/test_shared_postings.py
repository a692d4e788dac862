"""Shared lists: a query in a batch also scores the lists among its next ``shared_postings``
nearest heads that the batch reads anyway for other queries. Checked against a model built
from the navigator's answer and the lists' records read back: each query's answer is the exact
top-k over the members of its own lists plus its shared ones. Real io_uring and LMDB."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import vectordb.search as search_module
from tests.vectordb.helpers import brute_force, clustered
from vectordb import IndexConfig, IndexConfigError, SearchParams, SpannIndex
from vectordb.metric import Metric

DIM = 16


def _model(
    index: SpannIndex, members: dict[int, np.ndarray], queries: np.ndarray, own: int, extra: int
) -> list[set[int]]:
    """The ids each query of a one-chunk batch scores."""
    pids, dist = index.navigator.search(queries, own + extra)
    keep = search_module._prune(index.metric, pids, dist, SearchParams().prune_ratio)
    own_lists = [set(p[k].tolist()) for p, k in zip(pids[:, :own], keep[:, :own], strict=True)]
    read = set().union(*own_lists)
    scored = []
    for row, mine in enumerate(own_lists):
        shared = {p for p, k in zip(pids[row, own:], keep[row, own:], strict=True) if k} & read
        ids = [members[p] for p in mine | shared]
        scored.append(set(np.concatenate(ids).tolist()) if ids else set())
    return scored


async def _members(index: SpannIndex) -> dict[int, np.ndarray]:
    pids = np.flatnonzero(index.store.capacity > 0)
    batch = await index.store.read(pids)
    return {
        int(p): batch.records["id"][batch.starts[i] : batch.starts[i + 1]]
        for i, p in enumerate(pids)
    }


@pytest.mark.parametrize("metric", ["l2", "cosine"])
@pytest.mark.parametrize("n_queries", [1, 40, 150])  # one query; one-thread and split head scans
def test_a_batch_scores_its_own_and_its_shared_lists(
    tmp_path: Path, metric: str, n_queries: int
) -> None:
    vectors = clustered(3000, DIM, seed=41)
    ids = np.arange(3000, dtype=np.int64) * 5 + 1
    queries = clustered(n_queries, DIM, seed=42)
    own, extra, k = 3, 6, 8

    async def main() -> None:
        config = IndexConfig(dim=DIM, metric=metric, posting_limit=48)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(ids, vectors)
            params = SearchParams(max_postings=own, shared_postings=extra)
            found, scores = await index.search(queries, k=k, params=params)
            members = await _members(index)
            scored = _model(index, members, queries, own, extra)
            plain = _model(index, members, queries, own, 0)
        # the model is not vacuous: in a batch some query scores more than its own lists
        assert (scored != plain) == (n_queries > 1)
        position = {int(i): n for n, i in enumerate(ids)}
        for row, candidates in enumerate(scored):
            pool = np.array(sorted(candidates), np.int64)
            rows = np.array([position[i] for i in pool.tolist()], np.int64)
            truth, truth_scores = brute_force(
                Metric(metric), pool, vectors[rows], queries[row : row + 1], k
            )
            np.testing.assert_array_equal(found[row], truth[0])
            np.testing.assert_allclose(scores[row], truth_scores[0], rtol=1e-4, atol=1e-4)

    asyncio.run(main())


def test_shared_lists_only_improve_answers_also_in_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the chunking, a query scores a superset of its own lists: each answer's k-th
    distance is at most the one without shared lists, and a single query is unaffected."""
    vectors = clustered(3000, DIM, seed=43)
    queries = clustered(200, DIM, seed=44)
    monkeypatch.setattr(search_module, "READ_BUDGET_BYTES", 30 * 4096)  # a few queries a chunk

    async def main() -> None:
        config = IndexConfig(dim=DIM, posting_limit=48)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            alone = SearchParams(max_postings=3, shared_postings=0)
            _, without = await index.search(queries, k=10, params=alone)
            shared = SearchParams(max_postings=3)
            _, with_shared = await index.search(queries, k=10, params=shared)
            single = await index.search(queries[:1], k=10, params=shared)
            single_alone = await index.search(queries[:1], k=10, params=alone)
        assert (with_shared[:, -1] <= without[:, -1] + 1e-5).all()
        assert (with_shared[:, -1] < without[:, -1] - 1e-5).any()  # some query gained
        np.testing.assert_array_equal(single[0], single_alone[0])

    asyncio.run(main())


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_shared_postings_is_refused(bad: object) -> None:
    with pytest.raises(IndexConfigError, match="shared_postings"):
        SearchParams(shared_postings=bad)  # type: ignore[arg-type]
