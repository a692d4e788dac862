"""Compact twins of the shortlist runs (vectordb.tenancy.tenant_store, sq8; issue 15).

- the codec: codes decode to within half a step, distances from codes to within the codec's
  error of the exact ones, values outside the trained range clip;
- a cosine index keeps a whole twin of every shortlist after a build, grants, revokes, a
  checkpoint and a reopen, and a search through the twins finds what the exact search finds
  (scores within the codec's error); an L2 index keeps none;
- a twin is never read while its run is being rewritten: at every loop turn of a write that
  keeps a list's length, a twin said whole holds what its run holds;
- a checkpoint written without twins (before they existed) opens with none, searched on runs.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb.helpers import clustered
from tests.vectordb.tenancy_check import EXACT, assert_twins_whole, small_config
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.metric import Metric, prepare
from vectordb.posting_store import PostingItem
from vectordb.tenancy import Tenancy
from vectordb.tenancy.sq8 import Sq8Codec
from vectordb.tenancy.tenant_store import TenantStore

DIM = 16
N = 600
TENANTS = ["a", "b", 7]


def _rows(n: int) -> list[list[object]]:
    rng = np.random.default_rng(1)
    return [[t for t in TENANTS if rng.random() < 0.4] for _ in range(n)]


def _config(metric: str) -> IndexConfig:
    return small_config(dim=DIM, metric=metric, shortlist_limit=16, tenant_leaf_size=16)


def test_codec_round_trip_and_distances() -> None:
    vectors = prepare(Metric.COSINE, clustered(500, DIM, seed=3))
    codec = Sq8Codec.train(vectors)
    codes = codec.encode(vectors)
    assert codes.dtype == np.uint8 and codes.shape == vectors.shape
    assert np.all(np.abs(codec.decode(codes) - vectors) <= codec.step / 2 + 1e-6)
    query = vectors[0]
    exact = -(vectors @ query)
    approx = codec.distances(codec.query_terms(query), codes)
    assert approx.dtype == np.float32
    assert np.max(np.abs(approx - exact)) <= float(np.abs(query) @ codec.step) / 2 + 1e-5
    far = codec.encode(np.full((1, DIM), 1e6, np.float32))
    assert (far == 255).all() and (codec.encode(-far.astype(np.float32) * 1e6) == 0).all()
    assert not Sq8Codec.supports(Metric.L2, "float32")
    assert not Sq8Codec.supports(Metric.COSINE, "uint8")
    assert Sq8Codec.supports(Metric.IP, "float32")


@pytest.mark.parametrize("metric", ["cosine", "l2"])
def test_twins_through_updates_checkpoint_and_reopen(tmp_path: Path, metric: str) -> None:
    vectors = clustered(N, DIM, seed=4)
    queries = clustered(12, DIM, seed=5)

    async def check(index: SpannIndex) -> None:
        if metric == "l2":
            assert index.tenancy is not None and index.tenancy.store.codec is None
            return
        await assert_twins_whole(index)
        for tenant in TENANTS:
            exact = await index.search(queries, 10, EXACT, tenant=tenant)
            twins = await index.search(queries, 10, SearchParams(tenant_candidates=1 << 20),
                                       tenant=tenant)  # fmt: skip
            hits = np.mean(
                [len(set(a) & set(b)) for a, b in zip(exact.ids, twins.ids, strict=True)]
            )
            assert hits >= 9, f"{tenant!r}: {hits} of 10 through the twins"
            both = exact.ids == twins.ids
            assert np.allclose(exact.scores[both], twins.scores[both], atol=0.02)

    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", _config(metric)) as index:
            await index.build(np.arange(N), vectors, tenants=_rows(N))
            await check(index)
            await index.grant(np.arange(0, N, 3), "b")
            await index.revoke(np.arange(0, N, 5), "a")
            await index.checkpoint()  # the pending copies and merges: twins written beside
            await check(index)
            await index.insert(np.arange(N, N + 40), clustered(40, DIM, seed=6), [["a"]] * 40)
        async with await SpannIndex.open(tmp_path / "i") as index:  # the log replayed too
            await check(index)

    asyncio.run(main())


def test_a_twin_is_not_read_while_its_run_is_rewritten(tmp_path: Path) -> None:
    async def main() -> None:
        async with await SpannIndex.create(tmp_path / "i", _config("cosine")) as index:
            await index.build(np.arange(N), clustered(N, DIM, seed=4), tenants=_rows(N))
            tenancy = index.tenancy
            assert tenancy is not None
            store = tenancy.store
            entries = [e for e in tenancy.shortlists.entries() if e.live >= 4][:6]
            runs = await store.read(np.array([e.pid for e in entries]))
            items = []
            for k, entry in enumerate(entries):  # same lengths, other contents
                rec = runs.records[runs.starts[k] : runs.starts[k + 1]]
                items.append(PostingItem(entry.pid, rec["id"], rec["version"], -rec["vector"]))
            pids = np.array([e.pid for e in entries])
            old_starts = store.lists.start[pids].copy()
            codec = store.codec
            assert codec is not None
            write_twins = store.codes.write

            async def slow_twins(twins: list[PostingItem]) -> None:
                await asyncio.sleep(0.05)  # a window: runs switched, twins not yet
                await write_twins(twins)

            store.codes.write = slow_twins  # type: ignore[method-assign,assignment]
            write = asyncio.ensure_future(store.write(items))
            seen = 0
            while not write.done():
                whole = store.twins(pids)
                if (store.lists.start[pids] != old_starts).any():
                    seen += 1
                    assert not whole.any(), "a twin read as whole while its run was rewritten"
                if whole.any():  # both read as of this turn
                    held = pids[whole]
                    got_runs = store.start_views(held)
                    got_twins = store.start_twin_views(held)
                    for run, twin in zip(await got_runs, await got_twins, strict=True):
                        assert np.array_equal(codec.encode(run["vector"]), twin["vector"])
                await asyncio.sleep(0.001)
            await write
            assert seen, "no loop turn fell between the runs' and the twins' writes"
            await assert_twins_whole(index)

    asyncio.run(main())


def test_a_checkpoint_without_twins_opens_with_none(tmp_path: Path) -> None:
    async def main() -> None:
        vectors = clustered(N, DIM, seed=4)
        async with await SpannIndex.create(tmp_path / "i", _config("cosine")) as index:
            await index.build(np.arange(N), vectors, tenants=_rows(N))
            assert index.tenancy is not None and index._tenant_file is not None
            state, arrays = index.tenancy.snapshot()
            old = {k: v for k, v in arrays.items() if "codes" not in k and "sq8" not in k}
            # as an open of a checkpoint written before twins: a fresh store restores it
            file = index._tenant_file
            pages = index.engine.file_size(file) // 4096
            store = TenantStore(index.engine, file, DIM, "float32", pages)
            index.tenancy = Tenancy(index.config, index.metric, store)
            index.tenancy.restore(state, old)
            assert store.codec is None and not store.twins(np.arange(4)).any()
            queries = clustered(5, DIM, seed=8)
            exact = await index.search(queries, 10, EXACT, tenant="a")
            found = await index.search(queries, 10, SearchParams(tenant_candidates=1 << 20),
                                       tenant="a")  # fmt: skip
            assert np.array_equal(exact.ids, found.ids)  # the runs: exact scores
            assert np.allclose(exact.scores, found.scores, rtol=1e-5)

    asyncio.run(main())
