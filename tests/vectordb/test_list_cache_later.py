"""Lists handed to the cache to copy later (``ListCache.admit_later``): copied in a callback of
the loop, or at once by a lookup that needs them; never a list changed since it was read; the
buffer released exactly once, after its lists are copied. Real DramTier; an index at an ample
budget answers a repeated search from the cache, as before the copies left the answer's path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from tests.vectordb.helpers import clustered
from tiers.io import PAGE_SIZE_BYTES
from vectordb import IndexConfig, SpannIndex
from vectordb.list_cache import ListCache

PAGE = PAGE_SIZE_BYTES


def _lists(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    pids = np.arange(n, dtype=np.int64)
    views = [np.full(PAGE, pid + 1, np.uint8) for pid in range(n)]
    return pids, 10 * pids, np.ones(n, np.int64), views


def test_handed_lists_are_copied_later_or_when_looked_up() -> None:
    async def main() -> None:
        cache = ListCache(64 * PAGE)
        released: list[int] = []
        pids, start, count, views = _lists(4)

        def same(pids: np.ndarray, *_: object) -> np.ndarray:
            return pids != 2  # list 2 changed since it was read

        cache.admit_later(pids, start, count, views, same, lambda: released.append(1))
        assert cache.stats()["list_cache_admitted"] == 0 and not released  # not yet
        # a lookup copies the pending lists it needs first: list 1 is a hit at once
        assert cache.lookup(pids[1:2], start[1:2], count[1:2]).tolist() == [True]
        assert cache.stats()["list_cache_admitted"] == 1 and not released
        await asyncio.sleep(0)  # the loop's callback copies the rest and frees the buffer
        assert released == [1]
        hit = cache.lookup(pids, start, count)
        assert hit.tolist() == [True, True, False, True]  # never the changed one
        out = [np.zeros(PAGE, np.uint8) for _ in range(4)]
        assert (await cache.copy_into(pids[hit], [out[i] for i in np.flatnonzero(hit)])).all()
        assert all((out[i] == i + 1).all() for i in np.flatnonzero(hit))
        # a second hand-over copies the first at once; closing copies the last one
        cache.admit_later(pids, start, count, views, same, lambda: released.append(2))
        cache.admit_later(pids, start, count, views, same, lambda: released.append(3))
        assert released == [1, 2]
        await cache.aclose()
        assert released == [1, 2, 3]

    asyncio.run(main())


def test_an_index_answers_a_repeated_search_from_the_cache(tmp_path: Path) -> None:
    vectors = clustered(3000, 16, seed=71)

    async def main() -> None:
        path = tmp_path / "i"
        async with await SpannIndex.create(path, IndexConfig(dim=16)) as index:
            await index.build(None, vectors)
        async with await SpannIndex.open(path, memory_budget_bytes=64 << 20) as index:
            first = await index.search(vectors[5], 10)  # its lists: handed over, not copied
            read = index.stats()["bytes_read"]
            again = await index.search(vectors[5], 10)  # no await between: looked up first
            stats = index.stats()
            assert stats["bytes_read"] == read and stats["list_cache_hits"] > 0
            np.testing.assert_array_equal(first.ids, again.ids)

    asyncio.run(main())
