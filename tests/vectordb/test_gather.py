"""Gathered searches: many tasks each searching one query are answered in shared batches, each
answer at least as good as the query searched alone; errors and cancellation reach only the
callers concerned. Real io_uring and LMDB; the gatherer's own rules against a plain runner."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb.helpers import brute_force, clustered, recall
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.gather import SearchGatherer
from vectordb.metric import Metric

DIM = 16


def test_concurrent_single_queries_share_batches_and_lose_nothing(tmp_path: Path) -> None:
    vectors = clustered(3000, DIM, seed=51)
    queries = clustered(64, DIM, seed=52)

    async def main() -> tuple[list[np.ndarray], list[np.ndarray], dict[str, int]]:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=DIM)) as index:
            await index.build(None, vectors)
            params = SearchParams(max_postings=3)
            alone = [await index.search(q, k=10, params=params) for q in queries]
            before = index.stats()["gathered_batches"]
            together = await asyncio.gather(*(index.search(q, 10, params) for q in queries))
            stats = index.stats()
            stats["batches"] = stats["gathered_batches"] - before
        return [a.scores for a in alone], [t.scores for t in together], stats

    alone, together, stats = asyncio.run(main())
    assert stats["batches"] < len(queries) // 4  # 64 callers, a handful of batches
    assert stats["gathered_queries"] >= len(queries) // 2
    for a, t in zip(alone, together, strict=True):  # l2: a lower k-th distance is better
        assert t.shape == a.shape == (1, 10)
        assert t[0, -1] <= a[0, -1] + 1e-5


def test_gathered_answers_keep_each_callers_k_and_recall(tmp_path: Path) -> None:
    vectors = clustered(2000, DIM, seed=53)
    queries = clustered(24, DIM, seed=54)
    truth, _ = brute_force(Metric.L2, np.arange(len(vectors)), vectors, queries, 10)

    async def main() -> list[np.ndarray]:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=DIM)) as index:
            await index.build(None, vectors)
            calls = [index.search(q, k=1 + i % 10) for i, q in enumerate(queries)]
            return [r.ids for r in await asyncio.gather(*calls)]

    found = asyncio.run(main())
    for i, ids in enumerate(found):
        assert ids.shape == (1, 1 + i % 10)
    top1 = np.array([ids[0, 0] for ids in found])
    assert (top1 == truth[:, 0]).mean() >= 0.9
    full = np.full((len(found), 10), -1)
    for i, ids in enumerate(found):
        full[i, : ids.shape[1]] = ids[0]
    assert recall(full[9::10], truth[9::10]) >= 0.8  # the callers that asked for 10


def _runner(log: list[int], fail_on: int | None = None):  # type: ignore[no-untyped-def]
    async def run(queries: np.ndarray, k: int, params: object):  # type: ignore[no-untyped-def]
        log.append(len(queries))
        await asyncio.sleep(0.01)
        if fail_on is not None and fail_on in queries[:, 0]:
            raise ValueError("bad batch")
        ids = np.repeat(queries[:, :1].astype(np.int64), k, axis=1)
        return ids, np.zeros((len(queries), k), np.float32), np.zeros(0, np.int64)

    return run


def test_a_lone_caller_runs_at_once_and_later_ones_queue_behind_the_slots() -> None:
    async def main() -> list[int]:
        log: list[int] = []
        gatherer = SearchGatherer(_runner(log), max_in_flight=1)
        calls = [gatherer.search(np.full((1, 2), i, np.float32), 3, None) for i in range(9)]
        answers = await asyncio.gather(*calls)
        for i, (ids, _, _) in enumerate(answers):
            assert ids.tolist() == [[i, i, i]]  # each caller its own rows
        return log

    assert asyncio.run(main()) == [1, 8]


def test_a_failed_batch_fails_its_callers_only_and_cancelled_callers_are_dropped() -> None:
    async def main() -> None:
        log: list[int] = []
        gatherer = SearchGatherer(_runner(log, fail_on=5), max_in_flight=1, max_batch_queries=4)
        tasks = [
            asyncio.ensure_future(gatherer.search(np.full((1, 2), i, np.float32), 1, None))
            for i in range(9)
        ]
        await asyncio.sleep(0)
        tasks[2].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert log == [1, 4, 3]  # 0 alone; 1, 3, 4, 5 (2 cancelled); then 6, 7, 8
        assert isinstance(done[2], asyncio.CancelledError)
        for i in (1, 3, 4, 5):
            assert isinstance(done[i], ValueError)
        for i in (0, 6, 7, 8):
            assert done[i][0].tolist() == [[i]]  # type: ignore[index]

    asyncio.run(main())


@pytest.mark.parametrize("params", [SearchParams(max_postings=2), SearchParams(max_postings=5)])
def test_callers_with_different_settings_are_not_mixed(params: SearchParams) -> None:
    async def main() -> list[int]:
        log: list[int] = []
        gatherer = SearchGatherer(_runner(log), max_in_flight=1)
        other = SearchParams(max_postings=9)
        calls = [
            gatherer.search(np.zeros((1, 2), np.float32), 1, params if i % 2 else other)
            for i in range(7)
        ]
        await asyncio.gather(*calls)
        return log

    assert asyncio.run(main()) == [1, 3, 3]  # first alone; then one batch per setting
