"""ListCache against a plain model (a dict of the lists' current bytes): a hit always copies the
bytes of the list as it is now, whatever admissions, evictions and changes came before; the
cache never holds more than its capacity; hot lists are not flushed by a sweep of cold ones."""

from __future__ import annotations

import asyncio

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.io import PAGE_SIZE_BYTES
from vectordb.list_cache import ListCache

PAGE = PAGE_SIZE_BYTES
N_LISTS = 6


def _bytes_of(pid: int, version: int, pages: int) -> np.ndarray:
    return np.full(pages * PAGE, (pid * 31 + version) % 251, np.uint8)


_ops = st.lists(
    st.tuples(st.sampled_from(["read", "change"]), st.integers(0, N_LISTS - 1)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, capacity_pages=st.integers(0, 12))
def test_a_hit_is_always_the_list_as_it_is_now(
    ops: list[tuple[str, int]], capacity_pages: int
) -> None:
    async def main() -> None:
        cache = ListCache(capacity_pages * PAGE)
        version = dict.fromkeys(range(N_LISTS), 0)  # the model: each list's current contents
        start = {pid: 10 * pid for pid in range(N_LISTS)}
        pages = {pid: 1 + pid % 3 for pid in range(N_LISTS)}
        for op, pid in ops:
            if op == "change":  # rewritten in place, as often as not at the same start
                version[pid] += 1
                cache.note_changed(np.array([pid]))
                continue
            pids = np.array([pid])
            at, count = np.array([start[pid]]), np.array([pages[pid]])
            if cache.lookup(pids, at, count)[0]:
                out = np.zeros(pages[pid] * PAGE, np.uint8)
                if (await cache.copy_into(pids, [out]))[0]:
                    np.testing.assert_array_equal(out, _bytes_of(pid, version[pid], pages[pid]))
            fresh = _bytes_of(pid, version[pid], pages[pid])
            await cache.admit(pids, at, count, [fresh])
            assert cache.used_bytes <= cache.capacity_bytes
        await cache.aclose()

    asyncio.run(main())


def test_a_sweep_of_cold_lists_does_not_flush_the_hot_ones() -> None:
    async def main() -> dict[str, object]:
        cache = ListCache(4 * PAGE)
        one_page = np.array([1])

        async def read(pid: int) -> bool:
            pids, at = np.array([pid]), np.array([pid])
            hit = bool(cache.lookup(pids, at, one_page)[0])
            if not hit:
                await cache.admit(pids, at, one_page, [_bytes_of(pid, 0, 1)])
            return hit

        for _ in range(5):
            for hot in range(4):
                await read(hot)
        for cold in range(100, 140):  # each needed once
            await read(cold)
        hits = [await read(hot) for hot in range(4)]
        assert all(hits)
        return cache.stats()

    stats = asyncio.run(main())
    assert stats["list_cache_refused"] >= 30
    assert stats["list_cache_lists"] == 4


def test_a_list_bigger_than_the_cache_or_an_empty_cache_is_a_quiet_miss() -> None:
    async def main() -> None:
        for capacity in (0, PAGE):
            cache = ListCache(capacity)
            pids, at, count = np.array([3]), np.array([0]), np.array([2])
            await cache.admit(pids, at, count, [_bytes_of(3, 0, 2)])
            assert not cache.lookup(pids, at, count)[0]
            assert cache.used_bytes == 0
            await cache.aclose()

    asyncio.run(main())
