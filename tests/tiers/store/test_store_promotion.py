"""Promotion after a miss: in the get when it is only memory copies and drops, in the background
when a victim needs a demotion or a mutation holds the lock; concurrent gets of a store over
NVMe share engine submissions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tests.tiers.nvme.test_nvme import lease
from tiers.io.threaded import ThreadEngine
from tiers.memory.dram import DramTier
from tiers.memory.hbm import HbmTier
from tiers.nvme.nvme_tier import NvmeTier
from tiers.store.tiered_store import TieredStore
from tiers.testing.tier_contract import as_bytes


def _value(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("policy", ["lru", "lfu", "cost"])
def test_a_miss_is_promoted_within_the_get(tmp_path: Path, policy: str) -> None:
    async def main() -> None:
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        store = TieredStore([DramTier("dram", 3 * 5_000), nvme], policy)
        for i in range(6):
            await store.put(f"k{i}", _value(5_000, i))
        await store.drain()
        below = [k for k in store.keys("k") if store.tier_of(k) == "nvme"]
        assert below
        into = np.zeros(9_000, np.uint8)  # larger than the object
        got = await store.get(below[0], into=into)
        assert got is into and as_bytes(into[:5_000]) == _value(5_000, int(below[0][1:]))
        assert store.tier_of(below[0]) == "dram" and not store._tasks  # no background task
        into[:] = 0  # the caller reuses its buffer: the DRAM copy is the store's own
        assert as_bytes(await store.get(below[0])) == _value(5_000, int(below[0][1:]))
        stats = store.stats()["tiers"]
        assert stats[0]["promotions"] == 1 and stats[0]["evictions"] >= 1
        assert stats[0]["used_bytes"] <= 3 * 5_000
        for i in range(6):  # every object still whole, wherever it is
            assert as_bytes(await store.get(f"k{i}")) == _value(5_000, i)
        await store.aclose()

    asyncio.run(main())


def test_a_promotion_that_needs_a_demotion_runs_in_the_background() -> None:
    async def body() -> None:
        store = TieredStore(
            [HbmTier("hbm", 6_000, device="cpu"), DramTier("dram", 12_000)], write_through=False
        )
        await store.put("a", _value(5_000, 1))
        await store.put("b", _value(5_000, 2))  # a is demoted: its only copy is in dram
        assert as_bytes(await store.get("a")) == _value(5_000, 1)
        assert store.tier_of("a") == "dram"  # b, the victim, must move down first: later
        await store.drain()
        assert store.tier_of("a") == "hbm" and store.tier_of("b") == "dram"
        await store.aclose()

    asyncio.run(body())


def test_a_get_while_a_put_holds_the_lock_promotes_later(tmp_path: Path) -> None:
    async def main() -> None:
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        store = TieredStore([DramTier("dram", 5_000), nvme], "lru")
        await store.put("a", _value(5_000, 1))
        await store.put("b", _value(5_000, 2))  # a is on NVMe only now
        async with store._lock:  # as a put in flight would
            assert as_bytes(await store.get("a")) == _value(5_000, 1)
            assert store.tier_of("a") == "nvme"
        await store.drain()
        assert store.tier_of("a") == "dram"
        await store.aclose()

    asyncio.run(main())


def test_concurrent_store_gets_share_engine_submissions(tmp_path: Path) -> None:
    values = {f"k{i}": _value(4096 + 512 * (i % 3), i) for i in range(32)}

    async def main() -> None:
        engine = ThreadEngine(8)
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path, runtime=lease(engine), create=True)
        store = TieredStore([nvme], "lru")
        await store.put_many(values)
        before = engine.counters["batches"]
        got = await asyncio.gather(*(store.get(key) for key in values))
        assert engine.counters["batches"] - before <= 2  # one per get before gathering
        assert [as_bytes(v) for v in got] == list(values.values())
        await store.aclose()
        await engine.aclose()

    asyncio.run(main())
