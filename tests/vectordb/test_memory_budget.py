"""An index under a memory budget: the budget is checked and reported, what it leaves caches
lists, a cached list answers exactly as a read one, updates never let a stale copy answer,
and a damaged copy is caught like a damaged read. Real io_uring and LMDB."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb.helpers import brute_force, clustered, recall
from tiers import CorruptionError
from vectordb import IndexConfig, IndexConfigError, SearchParams, SpannIndex
from vectordb.metric import Metric

DIM = 16
AMPLE = 64 << 20


async def _built(path: Path, vectors: np.ndarray, budget: int | None) -> SpannIndex:
    index = await SpannIndex.create(path, IndexConfig(dim=DIM), memory_budget_bytes=budget)
    await index.build(None, vectors)
    return index


def test_cached_lists_answer_exactly_as_read_ones_and_save_reads(tmp_path: Path) -> None:
    vectors = clustered(3000, DIM, seed=61)
    queries = clustered(40, DIM, seed=62)

    async def main() -> None:
        async with await _built(tmp_path / "plain", vectors, None) as plain:
            expect = [await plain.search(q, 10) for q in queries]
            assert plain.stats()["list_cache_capacity_bytes"] == 0
        async with await SpannIndex.open(tmp_path / "plain", memory_budget_bytes=AMPLE) as index:
            for _ in range(2):  # the first pass fills the cache, the second hits it
                before = index.stats()["bytes_read"]
                got = [await index.search(q, 10) for q in queries]
                for g, e in zip(got, expect, strict=True):
                    np.testing.assert_array_equal(g.ids, e.ids)
                    np.testing.assert_allclose(g.scores, e.scores, rtol=1e-6)
            stats = index.stats()
        assert stats["bytes_read"] == before  # every list of the second pass was cached
        assert stats["list_cache_hits"] >= stats["list_cache_misses"]
        assert 0 < stats["list_cache_bytes"] <= stats["list_cache_capacity_bytes"]
        assert stats["memory_budget_bytes"] == AMPLE and not stats["memory_over_budget"]

    asyncio.run(main())


def test_updates_never_answer_from_a_stale_copy(tmp_path: Path) -> None:
    vectors = clustered(2000, DIM, seed=63)
    extra = clustered(400, DIM, seed=64)
    queries = extra[::8] + 0.01  # queries right on the new vectors

    async def main() -> tuple[np.ndarray, np.ndarray]:
        async with await _built(tmp_path / "i", vectors, AMPLE) as index:
            for q in queries:  # the lists the new vectors land in are now cached
                await index.search(q, 10)
            await index.insert(np.arange(2000, 2400), extra)
            await index.delete(np.arange(0, 2000, 3))
            found = np.concatenate([(await index.search(q, 10)).ids for q in queries])
            assert index.stats()["list_cache_hits"] > 0
        return found, np.arange(2000, 2400)[::8]

    found, inserted = asyncio.run(main())
    assert (found[:, 0] == inserted).mean() >= 0.95  # the new vectors are seen at once
    assert not np.isin(found, np.arange(0, 2000, 3)).any()  # the deleted ones are gone


def test_a_damaged_cached_copy_is_caught_like_a_damaged_read(tmp_path: Path) -> None:
    vectors = clustered(2000, DIM, seed=65)
    query = vectors[7] + 0.01

    async def main() -> None:
        async with await _built(tmp_path / "i", vectors, AMPLE) as index:
            await index.search(query, 10)
            cache = index.memory.cache
            arena = cache._tier._arena  # type: ignore[union-attr]
            arena[:] ^= 0x5A  # every cached byte damaged in memory
            result = await index.search(query, 10)
            assert result.degraded  # not a silent wrong answer
            with pytest.raises(CorruptionError):
                await index.search(query, 10, SearchParams(strict=True))

    asyncio.run(main())


def test_a_tight_budget_still_answers_well_and_says_when_it_is_too_small(tmp_path: Path) -> None:
    vectors = clustered(3000, DIM, seed=66)
    queries = clustered(200, DIM, seed=67)
    truth, _ = brute_force(Metric.L2, np.arange(3000), vectors, queries, 10)

    async def main() -> None:
        async with await _built(tmp_path / "i", vectors, 1) as index:
            ids, _ = await index.search(queries, 10)
            stats = index.stats()
        assert stats["memory_over_budget"] and stats["list_cache_capacity_bytes"] == 0
        assert recall(ids, truth) >= 0.85

    asyncio.run(main())


@pytest.mark.parametrize("bad", [-1, 1.5, "1GB", True])
def test_a_bad_budget_is_refused(tmp_path: Path, bad: object) -> None:
    async def main() -> None:
        with pytest.raises(IndexConfigError, match="memory_budget_bytes"):
            await SpannIndex.create(tmp_path / "i", IndexConfig(dim=DIM), memory_budget_bytes=bad)  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_tight_budget_drops_the_heads_bfloat16_copy(tmp_path: Path) -> None:
    vectors = clustered(1200, 384, seed=68)  # 96 heads x 384: a navigator big enough to count

    async def main() -> tuple[dict[str, object], dict[str, object], bool]:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=384)) as index:
            await index.build(None, vectors)
            index.navigator.allow_bfloat16 = True
            with_copy = index.memory.stats()
            copy_bytes = index.navigator.bfloat16_bytes()
        async with await SpannIndex.open(tmp_path / "i", memory_budget_bytes=1) as index:
            tight = index.stats()
            dropped = not index.navigator.allow_bfloat16
            ids, _ = await index.search(vectors[:20], 5)
            assert (ids[:, 0] == np.arange(20)).mean() >= 0.9
        assert copy_bytes > 0
        return with_copy, tight, dropped

    _, tight, dropped = asyncio.run(main())
    assert dropped and tight["memory_over_budget"]


def test_closing_an_index_that_only_searched_writes_no_checkpoint(tmp_path: Path) -> None:
    vectors = clustered(1000, DIM, seed=69)

    async def main() -> tuple[int, int, int]:
        async with await _built(tmp_path / "i", vectors, None) as index:
            pass
        meta = tmp_path / "i" / "meta" / "data.mdb"
        written = meta.stat().st_mtime_ns
        async with await SpannIndex.open(tmp_path / "i") as index:
            await index.search(vectors[:5], 5)
        untouched = meta.stat().st_mtime_ns
        async with await SpannIndex.open(tmp_path / "i") as index:
            await index.insert(np.array([5000]), vectors[:1])
        async with await SpannIndex.open(tmp_path / "i") as index:
            found, _ = await index.search(vectors[0], 2)
            replayed = index.stats()["wal_replayed"]
        assert 5000 in found[0].tolist()
        return written, untouched, replayed

    written, untouched, replayed = asyncio.run(main())
    assert untouched == written
    assert replayed == 0  # the insert was checkpointed at close


def test_searches_gathered_beside_updates_see_each_acknowledged_insert(tmp_path: Path) -> None:
    """Many one-query callers, a cached index and an updater at once: every insert that returned
    before a search started is found by it (no stale cached copy, no lost batch member)."""
    vectors = clustered(3000, DIM, seed=70)
    fresh = clustered(300, DIM, seed=71)

    async def main() -> list[bool]:
        async with await _built(tmp_path / "i", vectors, AMPLE) as index:
            acknowledged: list[int] = []
            seen: list[bool] = []

            async def updater() -> None:
                for row in range(0, len(fresh), 10):
                    await index.insert(np.arange(10_000 + row, 10_010 + row), fresh[row : row + 10])
                    acknowledged.extend(range(row, row + 10))
                    await asyncio.sleep(0)

            async def caller(offset: int) -> None:
                for _ in range(40):
                    if acknowledged:
                        row = acknowledged[(offset * 7919 + len(seen)) % len(acknowledged)]
                        ids, _ = await index.search(fresh[row], 1)
                        seen.append(int(ids[0, 0]) == 10_000 + row)
                    else:
                        await index.search(vectors[offset], 1)
                    await asyncio.sleep(0)

            await asyncio.gather(updater(), *(caller(i) for i in range(8)))
            assert index.stats()["gathered_batches"] > 0
            return seen

    seen = asyncio.run(main())
    assert len(seen) > 100
    assert np.mean(seen) >= 0.98  # its own vector is its nearest neighbour


def test_a_tight_budget_holds_the_heads_in_float16_and_answers_alike(tmp_path: Path) -> None:
    vectors = clustered(4000, 64, seed=72)
    queries = clustered(60, 64, seed=73)
    truth, _ = brute_force(Metric.L2, np.arange(4000), vectors, queries, 10)

    async def one_by_one(index: SpannIndex) -> np.ndarray:  # no shared lists: heads decide
        return np.concatenate([(await index.search(q, 10)).ids for q in queries])

    async def main() -> tuple[np.ndarray, np.ndarray, int, int]:
        async with await SpannIndex.create(tmp_path / "i", IndexConfig(dim=64)) as index:
            await index.build(None, vectors)
        async with await SpannIndex.open(tmp_path / "i") as index:
            wide = await one_by_one(index)
            wide_bytes = index.stats()["memory_fixed_bytes"]
        async with await SpannIndex.open(tmp_path / "i", memory_budget_bytes=1) as index:
            assert index.navigator.compact
            narrow = await one_by_one(index)
            narrow_bytes = index.stats()["memory_fixed_bytes"]
            await index.insert(np.array([9_999]), queries[:1])  # heads may grow: float16 too
            found, _ = await index.search(queries[0], 1)
            assert found[0, 0] == 9_999
        async with await SpannIndex.open(tmp_path / "i") as index:  # no budget: float32 again
            assert not index.navigator.compact
        return wide, narrow, wide_bytes, narrow_bytes

    wide, narrow, wide_bytes, narrow_bytes = asyncio.run(main())
    assert recall(narrow, truth) >= recall(wide, truth) - 0.02
    assert narrow_bytes < 0.75 * wide_bytes  # the heads are most of it, now at half width
