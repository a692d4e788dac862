"""Inserts and deletes against a plain model (a dict of live vectors), with lists so short that
splits, merges and reassignment happen all the time. Reading every list makes search exact, so
any live vector without a valid copy, or any deleted one still visible, shows up as a mismatch."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.vectordb.helpers import brute_force, clustered
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.metric import Metric

DIM = 8
EVERYTHING = SearchParams(max_postings=100_000, prune_ratio=1e9)
CONFIG = IndexConfig(dim=DIM, posting_limit=16, merge_threshold=3, reassign_neighbours=8)


async def assert_matches_model(index: SpannIndex, model: dict[int, np.ndarray], seed: int) -> None:
    queries = clustered(20, index.config.dim, seed=seed)
    found, scores = await index.search(queries, k=5, params=EVERYTHING)
    if not model:
        assert (found == -1).all()
        return
    ids = np.array(sorted(model), np.int64)
    vectors = np.stack([model[i] for i in ids.tolist()])
    _truth, truth_scores = brute_force(Metric.L2, ids, vectors, queries, 5)
    width = min(5, len(ids))
    assert set(found[:, :width].ravel().tolist()) <= set(model)  # nothing deleted comes back
    np.testing.assert_allclose(scores[:, :width], truth_scores[:, :width], rtol=1e-4, atol=1e-3)
    assert index.stats()["n_vectors"] == len(model)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert", "delete", "reopen"]),
            st.integers(1, 60),
            st.integers(0, 2**16),
        ),
        min_size=3,
        max_size=10,
    )
)
def test_random_inserts_and_deletes_match_a_dict(tmp_path_factory, ops) -> None:
    directory = tmp_path_factory.mktemp("idx")

    async def main() -> None:
        index = await SpannIndex.create(directory, CONFIG)
        model: dict[int, np.ndarray] = {}
        next_id = 0
        try:
            await index.build(None, clustered(200, DIM, seed=0))
            model.update({i: v for i, v in enumerate(clustered(200, DIM, seed=0))})
            next_id = 200
            for step, (kind, count, seed) in enumerate(ops):
                rng = np.random.default_rng(seed)
                if kind == "insert":
                    vectors = clustered(count, DIM, seed=seed)
                    ids = np.arange(next_id, next_id + count)
                    if model and rng.random() < 0.3:  # re-insert some deleted ids
                        ids[0] = -1 - next_id
                    ids = np.where(ids < 0, np.arange(count) + 10**6 + next_id, ids)
                    next_id += count
                    await index.insert(ids, vectors)
                    model.update(zip(ids.tolist(), vectors, strict=True))
                elif kind == "delete" and model:
                    victims = rng.choice(sorted(model), min(count, len(model)), replace=False)
                    victims = np.concatenate([victims, [10**9]])  # unknown ids are ignored
                    assert await index.delete(victims) == len(victims) - 1
                    for i in victims[:-1].tolist():
                        del model[i]
                else:
                    await index.aclose()
                    index = await SpannIndex.open(directory)
                await assert_matches_model(index, model, seed=step)
        finally:
            await index.aclose()
        index = await SpannIndex.open(directory)
        await assert_matches_model(index, model, seed=99)
        await index.aclose()

    asyncio.run(main())


def test_growth_splits_lists_and_recall_holds(tmp_path: Path) -> None:
    base = clustered(1000, DIM, seed=10)
    extra = clustered(1500, DIM, seed=11)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", CONFIG) as index:
            await index.build(None, base)
            heads = index.stats()["n_heads"]
            await index.insert(np.arange(1000, 2500), extra)
            await index.delete(np.arange(0, 1000, 2))
            stats = index.stats()
            assert stats["splits"] > 0 and stats["n_heads"] > heads
            assert stats["reassigned"] > 0
            assert int(index.store.count.max()) <= CONFIG.posting_limit
            model = {i: v for i, v in zip(range(1000, 2500), extra, strict=True)}
            model.update({i: base[i] for i in range(1, 1000, 2)})
            await assert_matches_model(index, model, seed=12)
            queries = clustered(100, DIM, seed=13)
            found, _ = await index.search(queries, 10, SearchParams(max_postings=16))
            ids = np.array(sorted(model))
            truth, _ = brute_force(Metric.L2, ids, np.stack([model[i] for i in ids]), queries, 10)
            hits = [
                len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist(), strict=True)
            ]
            assert np.mean(hits) / 10 >= 0.9

    asyncio.run(main())


def test_deleting_most_vectors_merges_lists(tmp_path: Path) -> None:
    base = clustered(1500, DIM, seed=20)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", CONFIG) as index:
            await index.build(None, base)
            await index.delete(np.arange(0, 1500)[np.arange(1500) % 10 != 0])
            await index.search(clustered(200, DIM, seed=21), 5, EVERYTHING)  # notes small lists
            await index.delete(np.array([10**9]))  # the next update merges them
            assert index.stats()["merges"] > 0
            model = {i: base[i] for i in range(0, 1500, 10)}
            await assert_matches_model(index, model, seed=22)

    asyncio.run(main())


def test_runs_freed_by_rewrites_force_a_checkpoint(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With a log threshold never reached, the runs that copy-on-write frees (reusable only
    after a checkpoint) still never pass a quarter of the file: a checkpoint hands them back."""
    from vectordb import updates

    monkeypatch.setattr(updates, "_GARBAGE_MIN_PAGES", 64, raising=False)
    dim = 64  # records of 280 bytes: a list spans pages, so moves and splits free runs
    config = IndexConfig(dim=dim, posting_limit=16, merge_threshold=3, checkpoint_wal_bytes=1 << 30)
    base, extra = clustered(400, dim, seed=20), clustered(2500, dim, seed=21)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, base)
            before = index.stats()["checkpoints"]
            for first in range(0, len(extra), 250):
                rows = np.arange(first, min(first + 250, len(extra)))
                await index.insert(rows + 400, extra[rows])
                space = index.store.space
                assert space.pending_pages < max(64, space.file_pages // 4)
            assert index.stats()["checkpoints"] > before
            assert index.wal.bytes_written < config.checkpoint_wal_bytes
            model = {i: v for i, v in enumerate(base)}
            model.update({400 + i: v for i, v in enumerate(extra)})
            await assert_matches_model(index, model, seed=22)

    asyncio.run(main())


def test_an_index_never_built_takes_inserts(tmp_path: Path) -> None:
    """Its first insert chooses the heads; the lists they own had no directory rows yet (an
    IndexError before), with and without tenancy."""

    async def main() -> None:
        vectors = clustered(300, 8, seed=3)
        for tenancy in (False, True):
            path = tmp_path / f"idx-{tenancy}"
            index = await SpannIndex.create(path, IndexConfig(dim=8, tenancy=tenancy))
            rows = [[1]] * 100 if tenancy else None
            await index.insert(np.arange(100), vectors[:100], rows)
            await index.insert(np.arange(100, 300), vectors[100:], None)
            ids, _ = await index.search(vectors[:5], k=1, params=SearchParams(max_postings=64))
            assert ids[:, 0].tolist() == list(range(5))
            if tenancy:
                assert index.count(1) == 100
            await index.aclose()
            reopened = await SpannIndex.open(path)
            assert reopened.stats()["n_vectors"] == 300
            await reopened.aclose()

    asyncio.run(main())
