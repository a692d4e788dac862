"""The compact navigator (SQ8 HNSW, exact re-rank on float16 heads): recall against brute force
on the float16 heads, exact distances, one copy of the heads, its bytes in the budget."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.compact_hnsw import CompactHnsw
from vectordb.metric import Metric, pairwise_distances, prepare
from vectordb.navigator import Navigator

from .helpers import brute_force, clustered, recall


def _exact(metric: Metric, heads16: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    dist = pairwise_distances(metric, queries, heads16.astype(np.float32))
    return np.sort(dist, axis=1)[:, :k]


@pytest.mark.parametrize("metric", [Metric.L2, Metric.COSINE])
def test_nearest_heads_match_brute_force_on_the_float16_heads(metric: Metric) -> None:
    heads = prepare(metric, clustered(3000, 32, seed=1))
    queries = prepare(metric, clustered(60, 32, seed=2))
    heads16 = heads.astype(np.float16)
    pids = np.arange(len(heads)) * 3 + 7  # pids are not positions
    nav = Navigator(32, metric, "hnsw")
    nav.add(heads16, pids, take=True)
    assert nav.layout == "hnsw-sq8" and nav.compact
    found, dist = nav.search(queries, 20)
    truth_dist = pairwise_distances(metric, queries, heads16.astype(np.float32))
    truth = pids[np.argsort(truth_dist, axis=1, kind="stable")[:, :20]]
    assert recall(found, truth) >= 0.93  # the float32 graph: ~0.95 on these
    # every distance is the exact one to that float16 head (the re-rank), nearest first
    exact = np.take_along_axis(truth_dist, (found - 7) // 3, axis=1)
    np.testing.assert_allclose(dist, exact, rtol=1e-4, atol=1e-4)
    assert (np.diff(dist, axis=1) >= 0).all()


def test_one_copy_of_the_heads_and_its_bytes_counted() -> None:
    heads16 = clustered(2000, 64, seed=3).astype(np.float16)
    nav = Navigator(64, Metric.L2, "hnsw")
    nav.add(heads16, np.arange(2000), take=True)
    graph = nav._index
    assert isinstance(graph, CompactHnsw)
    assert graph._heads is heads16  # the checkpoint's array is kept, not copied
    codes_and_links = graph.nbytes - heads16.nbytes - graph._norms.nbytes
    assert 64 * 2000 <= codes_and_links < (64 + 400) * 2000  # SQ8 codes + links
    assert nav.resident_bytes() >= graph.nbytes
    # a float32 HNSW of the same heads holds more (4 bytes a dimension)
    wide = Navigator(64, Metric.L2, "hnsw")
    wide.add(heads16.astype(np.float32), np.arange(2000))
    assert wide.layout == "hnsw" and nav.resident_bytes() < wide.resident_bytes()


def test_heads_change_and_stay_compact() -> None:
    heads = clustered(1500, 16, seed=4)
    nav = Navigator(16, Metric.L2, "hnsw")
    nav.add(heads.astype(np.float16), np.arange(1500), take=True)
    nav.add(heads[:10] + 0.5, np.arange(1500, 1510))  # a split's new heads, float32
    nav.remove(list(range(0, 600)))  # past a tenth dead: the graph is rebuilt
    assert nav.layout == "hnsw-sq8" and nav.n_heads == 910
    got = nav.vectors_of(np.array([1500, 700]))
    expect = np.stack([heads[0] + 0.5, heads[700]]).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, expect)
    found, _ = nav.search(heads[700:701], 1)
    assert found[0, 0] == 700
    with pytest.raises(KeyError):
        nav.remove([5])


def test_an_index_opened_tight_uses_it_and_counts_it(tmp_path: Path) -> None:
    vectors = clustered(3000, 64, seed=5)
    queries = clustered(40, 64, seed=6)
    config = IndexConfig(dim=64, navigator="hnsw")
    truth, _ = brute_force(Metric.L2, np.arange(3000), vectors, queries, 10)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            wide = index.stats()
            ample, _ = await index.search(queries, 10, SearchParams(max_postings=16))
        # a budget under 3x the heads' float32 bytes (~240 x 256 B) holds them in float16
        async with await SpannIndex.open(tmp_path / "i", memory_budget_bytes=100_000) as index:
            stats = index.stats()
            tight, _ = await index.search(queries, 10, SearchParams(max_postings=16))
        assert wide["navigator_layout"] == "hnsw" and stats["navigator_layout"] == "hnsw-sq8"
        assert stats["navigator_bytes"] == index.navigator.resident_bytes()
        assert stats["navigator_bytes"] <= stats["memory_fixed_bytes"]
        assert stats["navigator_bytes"] < wide["navigator_bytes"]
        assert recall(tight, truth) >= recall(ample, truth) - 0.02

    asyncio.run(main())
