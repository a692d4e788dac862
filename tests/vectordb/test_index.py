"""SpannIndex end to end on real files: build, search against a brute-force oracle, reopen,
bad input, resident memory. Real io_uring (or the thread fallback) and real LMDB throughout."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb.helpers import brute_force, clustered, recall
from vectordb import (
    DuplicateIdError,
    IndexConfig,
    IndexConfigError,
    InvalidVectorsError,
    SearchParams,
    SpannIndex,
    default_postings,
)
from vectordb.errors import IndexClosedError
from vectordb.metric import Metric

EVERYTHING = SearchParams(max_postings=100_000, prune_ratio=1e9)
DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "debian-minilm"


@pytest.mark.parametrize("metric", ["l2", "ip", "cosine"])
def test_recall_against_brute_force(tmp_path: Path, metric: str) -> None:
    vectors = clustered(4000, 24, seed=1)
    queries = clustered(100, 24, seed=2)
    ids = np.arange(4000, dtype=np.int64) * 3 + 7  # ids need not be dense

    async def main() -> None:
        config = IndexConfig(dim=24, metric=metric, posting_limit=64)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(ids, vectors)
            found, scores = await index.search(queries, k=10, params=SearchParams(max_postings=32))
        truth, truth_scores = brute_force(Metric(metric), ids, vectors, queries, 10)
        assert recall(found, truth) >= 0.9
        exact = found[:, 0] == truth[:, 0]  # where the best match agrees, so does its score
        np.testing.assert_allclose(scores[exact, 0], truth_scores[exact, 0], rtol=1e-3, atol=1e-3)
        assert (
            (np.diff(scores, axis=1) >= -1e-4).all()
            if metric == "l2"
            else (np.diff(scores, axis=1) <= 1e-4).all()
        )
        assert all(len(set(row)) == len(row) for row in found.tolist())  # replicas deduplicated

    asyncio.run(main())


def test_reopen_finds_the_same_results(tmp_path: Path) -> None:
    vectors = clustered(2000, 16, seed=3)
    queries = clustered(50, 16, seed=4)

    async def main() -> None:
        index = await SpannIndex.create(tmp_path / "i", IndexConfig(dim=16))
        await index.build(None, vectors)
        before = await index.search(queries, 5)
        stats = index.stats()
        await index.aclose()
        with pytest.raises(IndexClosedError):
            await index.search(queries, 5)
        index = await SpannIndex.open(tmp_path / "i")
        after = await index.search(queries, 5)
        assert index.stats()["n_vectors"] == stats["n_vectors"] == 2000
        assert index.stats()["n_heads"] == stats["n_heads"]
        await index.aclose()
        np.testing.assert_array_equal(before[0], after[0])

    asyncio.run(main())


def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=8)) as index:
            with pytest.raises(InvalidVectorsError, match="dim"):
                await index.build(None, np.zeros((10, 9), np.float32))
            bad = np.ones((10, 8), np.float32)
            bad[3, 2] = np.nan
            with pytest.raises(InvalidVectorsError):
                await index.build(None, bad)
            with pytest.raises(DuplicateIdError):
                await index.build(np.array([1, 2, 2]), np.ones((3, 8), np.float32))
            assert index.stats()["n_vectors"] == 0
            await index.build(None, clustered(300, 8, seed=5))
            with pytest.raises(IndexConfigError, match="empty"):
                await index.build(None, clustered(10, 8, seed=6))
            with pytest.raises(DuplicateIdError):
                await index.insert(np.array([5]), np.ones((1, 8), np.float32))
            with pytest.raises(InvalidVectorsError):
                await index.search(np.ones((2, 7), np.float32), 3)
            for bad_k in (0, -1, 2.5, True, "10"):
                with pytest.raises(InvalidVectorsError, match="k must be"):
                    await index.search(np.ones((2, 8), np.float32), bad_k)
            # a k far above the index is cut to what it holds (10**9 tried to take 14.9 GiB)
            ids, scores = await index.search(np.ones((2, 8), np.float32), 10**9, EVERYTHING)
            assert ids.shape == scores.shape == (2, 300)
            assert sorted(ids[0].tolist()) == list(range(300))
            assert index.stats()["n_vectors"] == 300
        with pytest.raises(IndexConfigError, match="already holds"):
            await SpannIndex.create(tmp_path / "i", IndexConfig(dim=8))

    asyncio.run(main())


def test_bad_configs() -> None:
    with pytest.raises(IndexConfigError):
        IndexConfig(dim=0)
    with pytest.raises(IndexConfigError, match="metric"):
        IndexConfig(dim=4, metric="hamming")
    with pytest.raises(IndexConfigError):
        IndexConfig(dim=4, dtype="float64")
    with pytest.raises(IndexConfigError):
        SearchParams(max_postings=0)
    with pytest.raises(IndexConfigError, match="unknown"):
        IndexConfig.from_dict({"dim": 4, "colour": "red"})
    for closure in (0.5, float("nan")):
        with pytest.raises(IndexConfigError, match="closure"):
            IndexConfig(dim=4, closure=closure)


def test_the_default_knob_grows_with_the_heads(tmp_path: Path) -> None:
    assert [default_postings(h) for h in (0, 10, 5000)] == [8, 8, 8]
    assert default_postings(20_000) == 16 and default_postings(160_000) == 45
    sizes = [default_postings(h) for h in range(0, 10**6, 7919)]
    assert sizes == sorted(sizes)  # never fewer lists for a bigger index
    assert SearchParams().max_postings is None

    vectors = clustered(2000, 8, seed=50)
    queries = clustered(40, 8, seed=51)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=8)) as index:
            await index.build(None, vectors)
            stats = index.stats()
            # a small index (under probe_rule.MIN_HEADS heads) takes the floor unmeasured
            assert stats["default_max_postings"] == default_postings(stats["n_heads"])
            assert stats["default_max_postings_floor"] == stats["default_max_postings"]
            default = await index.search(queries, k=5)
            explicit = SearchParams(max_postings=stats["default_max_postings"])
            same = await index.search(queries, k=5, params=explicit)
            other = await index.search(queries, k=5, params=SearchParams(max_postings=1))
        np.testing.assert_array_equal(default[0], same[0])
        assert not np.array_equal(default[0], other[0])

    asyncio.run(main())


def test_uint8_vectors(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    vectors = np.clip(clustered(1500, 32, seed=7) * 10 + 128, 0, 255).astype(np.uint8)
    queries = vectors[rng.choice(1500, 40, replace=False)]

    async def main() -> None:
        config = IndexConfig(dim=32, dtype="uint8")
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            found, scores = await index.search(queries, 1, SearchParams(max_postings=16))
        truth, _ = brute_force(Metric.L2, np.arange(1500), vectors, queries, 1)
        assert (found[:, 0] == truth[:, 0]).mean() >= 0.95
        assert (scores[:, 0] == 0).mean() >= 0.95  # a stored vector finds itself

    asyncio.run(main())


@pytest.mark.skipif(not DATA.exists(), reason="needs ../shared/data/debian-minilm (CI has it)")
def test_debian_minilm_recall_and_memory(tmp_path: Path) -> None:
    vectors = np.load(DATA / "embeddings.npy")
    queries = np.load(DATA / "queries.npy")[:200]
    truth = np.load(DATA / "gt_ids.npy")[:200, :10]

    async def main() -> None:
        config = IndexConfig(dim=vectors.shape[1], metric="cosine")
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            found, _ = await index.search(queries, 10)  # the default setting
            stats = index.stats()
        assert recall(found, truth) >= 0.9
        assert stats["resident_fraction"] <= 0.15
        assert stats["n_heads"] < 0.15 * len(vectors)

    asyncio.run(main())


def test_build_from_files(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from vectordb.vectors_input import write_fvecs

    vectors = clustered(500, 12, seed=30)
    write_fvecs(tmp_path / "v.fvecs", vectors)
    table = pa.table(
        {
            "id": pa.array(np.arange(500, dtype=np.int64) + 1000),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 12),
        }
    )
    pq.write_table(table, tmp_path / "v.parquet")

    async def main() -> None:
        for name, source, first in (
            ("f", tmp_path / "v.fvecs", 0),
            ("p", tmp_path / "v.parquet", 1000),
        ):
            async with await SpannIndex.create(tmp_path / name, IndexConfig(dim=12)) as index:
                await index.build_from(source, id_column="id" if name == "p" else None)
                found, _ = await index.search(vectors[:20], 1, SearchParams(max_postings=16))
                np.testing.assert_array_equal(found[:, 0], np.arange(20) + first)

    asyncio.run(main())


# ids the writer never deletes: 50 queries (head scan, then reads), 250 (reads start while the
# scoring thread is still scanning heads, so splits must wait for it: heads_quiet)
NEVER_DELETED = [
    np.arange(550, 600),
    np.concatenate([np.arange(s + 50, s + 100) for s in range(0, 500, 100)]),
]


@pytest.mark.parametrize("kept", NEVER_DELETED, ids=["50", "250"])
def test_searches_run_while_inserting(tmp_path: Path, kept: np.ndarray) -> None:
    base = clustered(1000, 16, seed=40)
    extra = clustered(1000, 16, seed=41)

    async def main() -> None:
        config = IndexConfig(dim=16, posting_limit=24, merge_threshold=3)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, base)

            async def writer() -> None:
                for start in range(0, 1000, 100):
                    await index.insert(
                        np.arange(1000 + start, 1100 + start), extra[start : start + 100]
                    )
                    await index.delete(np.arange(start, start + 50))
                    if start == 500:
                        await index.checkpoint()  # frees runs while searches may read them

            async def reader() -> int:
                rounds = 0
                while not done.is_set():
                    found, _ = await index.search(base[kept], 1, EVERYTHING)
                    np.testing.assert_array_equal(found[:, 0], kept)
                    rounds += 1
                    await asyncio.sleep(0.05)  # a search every 50 ms: the writer keeps going
                return rounds

            done = asyncio.Event()
            task = asyncio.create_task(reader())
            await writer()
            done.set()
            assert await task > 0
            assert index.stats()["splits"] > 0 and index.stats()["reassigned"] > 0

    asyncio.run(main())


def test_a_query_equal_to_a_head_still_reads_other_lists(tmp_path: Path) -> None:
    vectors = clustered(600, 8, seed=50)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=8)) as index:
            await index.build(None, vectors)
            heads, _ = index.navigator.snapshot()
            head_vector = index.navigator.vectors_of(heads[:1])
            found, _ = await index.search(head_vector, 20, SearchParams(max_postings=64))
        truth, _ = brute_force(Metric.L2, np.arange(600), vectors, head_vector, 20)
        assert recall(found, truth) >= 0.9  # distance 0 to one head must not prune the rest

    asyncio.run(main())


def test_float16_lists_keep_recall_and_refuse_overflow(tmp_path: Path) -> None:
    vectors = clustered(3000, 24, seed=60)
    queries = clustered(80, 24, seed=61)

    async def main() -> None:
        config = IndexConfig(dim=24, metric="cosine", dtype="float16")
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            found, _ = await index.search(queries, 10, SearchParams(max_postings=32))
            with pytest.raises(InvalidVectorsError, match="range"):
                await index.insert(np.array([10**6]), np.full((1, 24), 1e6, np.float32))
            stats = index.stats()
        truth, _ = brute_force(Metric.COSINE, np.arange(3000), vectors, queries, 10)
        assert recall(found, truth) >= 0.9
        assert stats["raw_vector_bytes"] == 3000 * 24 * 4  # the float32 input is the base

    asyncio.run(main())


def test_batch_paths_agree_with_one_query_at_a_time(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A large batch (head scan split over two threads, distances or reads cut into chunks,
    lists shared between queries, the read buffer reused) answers exactly as single queries
    do when queries score only their own lists (shared_postings=0)."""
    import vectordb.search as search_module

    vectors = clustered(3000, 16, seed=11)
    queries = clustered(150, 16, seed=12)

    async def main() -> None:
        config = IndexConfig(dim=16, metric="l2", posting_limit=48)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            params = SearchParams(max_postings=6, shared_postings=0)
            whole = await index.search(queries, k=7, params=params)
            assert index.stats()["spare_buffer_bytes"] > 0
            monkeypatch.setattr(search_module, "_CELL_BUDGET", 6 * 48 * 5)  # 5-query chunks
            chunked = await index.search(queries, k=7, params=params)
            monkeypatch.setattr(search_module, "_CELL_BUDGET", 1 << 22)
            monkeypatch.setattr(search_module, "READ_BUDGET_BYTES", 40 * 4096)  # ~2 queries
            reads_before = index.stats()["posting_reads"]
            by_bytes = await index.search(queries, k=7, params=params)
            assert index.stats()["posting_reads"] - reads_before > 150  # lists read again
            alone = [await index.search(q[None, :], k=7, params=params) for q in queries]
        for found in (whole, chunked, by_bytes):
            np.testing.assert_array_equal(found[0], np.concatenate([a[0] for a in alone]))
            np.testing.assert_allclose(
                found[1], np.concatenate([a[1] for a in alone]), rtol=1e-5, atol=1e-5
            )

    asyncio.run(main())


def test_placement_settings_survive_a_reopen(tmp_path: Path) -> None:
    async def main() -> None:
        config = IndexConfig(dim=8, closure=float("inf"), replica_count=3)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, clustered(300, 8, seed=30))
        async with await SpannIndex.open(tmp_path / "i") as index:
            assert index.config == config

    asyncio.run(main())
    old = IndexConfig(dim=8).to_dict()
    del old["closure"]  # written before the closure rule existed
    assert IndexConfig.from_dict(old).closure == float("inf")


def test_build_lays_lists_back_to_back_unless_asked_for_room(tmp_path: Path) -> None:
    """By default the lists are written back to back in head order, each holding just what
    its pages fit, so the first inserts move lists; ``append_reserve`` gives each list room for
    that share more records, and far fewer move."""
    from vectordb.posting_format import PAGE_BYTES, pages_for

    vectors = clustered(4000, 128, seed=31)  # 536-byte records: a page's spare room is small
    extra = clustered(300, 128, seed=32)

    async def moved_by_inserts(reserve: float) -> int:
        config = IndexConfig(dim=128, posting_limit=64, append_reserve=reserve)
        async with await SpannIndex.create(tmp_path / f"i{reserve}", config) as index:
            await index.build(None, vectors)
            store = index.store
            live = np.flatnonzero(store.capacity > 0)
            count, capacity = store.count[live].astype(np.int64), store.capacity[live]
            pages = pages_for(capacity.astype(np.int64), store.rec_bytes)
            if reserve == 0:
                np.testing.assert_array_equal(pages, pages_for(count, store.rec_bytes))
                assert (capacity == pages * PAGE_BYTES // store.rec_bytes).all()
                order = np.argsort(store.start[live])
                ends = store.start[live][order] + pages[order]
                assert (store.start[live][order][1:] == ends[:-1]).all(), "back to back"
            else:
                assert (capacity >= np.ceil(count * (1 + reserve))).all()
            before = store.start.copy()
            await index.insert(np.arange(len(extra)) + 10**6, extra)
            found, _ = await index.search(extra[:20], k=1, params=EVERYTHING)
            assert (found[:, 0] == np.arange(20) + 10**6).all()
            return int((store.start[live] != before[live]).sum())

    async def main() -> None:
        compact, roomy = await moved_by_inserts(0.0), await moved_by_inserts(0.5)
        assert compact > 20 and roomy < compact / 4, (compact, roomy)

    asyncio.run(main())
