"""TieredStore against a dict, under tiny capacities that force constant migration."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tiers.io.errors import CapacityError
from tiers.memory.dram import DramTier
from tiers.memory.hbm import HbmTier
from tiers.nvme.nvme_tier import NvmeTier
from tiers.store.tiered_store import TieredStore
from tiers.testing.tier_contract import as_bytes

KEYS = st.sampled_from([f"obj{i}" for i in range(10)])


def _value(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


async def _memory_store(policy: str) -> TieredStore:
    return TieredStore(
        [HbmTier("hbm", 6_000, device="cpu"), DramTier("dram", 12_000)], policy, write_through=False
    )


class StoreMachine(RuleBasedStateMachine):
    """Random put/get/delete/pin/prefetch; the store must always agree with the dict."""

    policy = "lru"
    with_nvme = False

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = tempfile.TemporaryDirectory(prefix="tierkit-store-")
        self.store = self.run(self._open())
        self.model: dict[str, bytes] = {}
        self.pinned: set[str] = set()
        self.step = 0

    async def _open(self) -> TieredStore:
        if not self.with_nvme:
            return await _memory_store(self.policy)
        nvme = await NvmeTier.open("nvme", 256 * 1024, Path(self.directory.name), create=True)
        tiers = [HbmTier("hbm", 6_000, device="cpu"), DramTier("dram", 12_000), nvme]
        return TieredStore(tiers, self.policy)

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    @rule(key=KEYS, size=st.integers(0, 7_000), pin=st.booleans())
    def put(self, key: str, size: int, pin: bool) -> None:
        self.step += 1
        value = _value(size, self.step)
        try:
            self.run(self.store.put(key, value, pin=pin and len(self.pinned) < 2))
        except CapacityError:
            return  # legal when pinned objects and sizes leave no room; the old value stays
        self.model[key] = value
        if pin and len(self.pinned) < 2:
            self.pinned.add(key)

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        got = self.run(self.store.get(key))
        assert (got is None) == (key not in self.model)
        if got is not None:
            assert as_bytes(got) == self.model[key]

    @rule(keys=st.lists(KEYS, max_size=5), into=st.booleans())
    def get_many(self, keys: list[str], into: bool) -> None:
        outs = [np.zeros(7_000, np.uint8) for _ in keys] if into else None
        got = self.run(self.store.get_many(keys, into=outs))
        for key, value in zip(keys, got, strict=True):
            assert (value is None) == (key not in self.model)
            if value is not None:
                assert as_bytes(value)[: len(self.model[key])] == self.model[key]

    @rule(pairs=st.lists(st.tuples(KEYS, st.integers(0, 7_000)), max_size=4))
    def put_many(self, pairs: list[tuple[str, int]]) -> None:
        self.step += 1
        items = [(key, _value(size, 100 * self.step + i)) for i, (key, size) in enumerate(pairs)]
        done = dict(items)
        try:
            self.run(self.store.put_many(items))
        except CapacityError:  # the pairs before the one that did not fit are stored
            stored = {key: self.run(self.store.get(key)) for key in done if key in self.store}
            done = {k: v for k, v in done.items() if k in stored and as_bytes(stored[k]) == v}
        self.model.update(done)

    @rule(key=KEYS, data=st.data())
    def get_range(self, key: str, data: st.DataObject) -> None:
        if key not in self.model or not self.model[key]:
            return
        size = len(self.model[key])
        offset = data.draw(st.integers(0, size - 1))
        length = data.draw(st.integers(0, size - offset))
        got = self.run(self.store.get(key, byte_range=(offset, length)))
        assert as_bytes(got) == self.model[key][offset : offset + length]

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        assert self.run(self.store.delete(key)) == (key in self.model)
        self.model.pop(key, None)
        self.pinned.discard(key)

    @rule(keys=st.lists(KEYS, max_size=4))
    def delete_many(self, keys: list[str]) -> None:
        present = set(keys) & set(self.model)
        assert self.run(self.store.delete_many(keys)) == len(present)
        for key in present:
            del self.model[key]
        self.pinned -= present

    @precondition(lambda self: self.pinned)
    @rule()
    def unpin_all(self) -> None:
        for key in self.pinned:
            self.run(self.store.unpin(key))
        self.pinned.clear()

    @rule(keys=st.lists(KEYS, max_size=4))
    def prefetch(self, keys: list[str]) -> None:
        self.run(self.store.prefetch(keys))

    @rule()
    def let_migrations_finish(self) -> None:
        self.run(self.store.drain())

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert sorted(self.store.keys()) == sorted(self.model)
        for tier in self.store.tiers:
            assert tier.used_bytes <= tier.capacity_bytes
        for key in self.pinned & set(self.model):
            assert self.store.tier_of(key) is not None

    def teardown(self) -> None:
        self.run(self.store.aclose())
        self.loop.close()
        self.directory.cleanup()


_SETTINGS = settings(
    max_examples=25,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class LruMachine(StoreMachine):
    policy = "lru"


class LfuMachine(StoreMachine):
    policy = "lfu"


class CostMachine(StoreMachine):
    policy = "cost"


class NvmeMachine(StoreMachine):
    policy = "cost"
    with_nvme = True


TestLruStore = LruMachine.TestCase
TestLruStore.settings = _SETTINGS
TestLfuStore = LfuMachine.TestCase
TestLfuStore.settings = _SETTINGS
TestCostStore = CostMachine.TestCase
TestCostStore.settings = _SETTINGS
TestNvmeStore = NvmeMachine.TestCase
TestNvmeStore.settings = settings(_SETTINGS, max_examples=10)


def test_placement_promotion_and_pinning() -> None:
    async def body() -> None:
        store = await _memory_store("lru")
        await store.put("a", _value(5_000, 1))
        assert store.tier_of("a") == "hbm"
        await store.put("b", _value(5_000, 2))  # hbm is full: a is demoted to dram
        assert store.tier_of("b") == "hbm" and store.tier_of("a") == "dram"
        assert as_bytes(await store.get("a")) == _value(5_000, 1)
        await store.drain()  # the hit in dram promoted a back to hbm
        assert store.tier_of("a") == "hbm" and store.tier_of("b") == "dram"
        await store.pin("b")
        await store.get("b")
        await store.drain()
        assert store.tier_of("b") == "dram"  # pinned objects never move
        stats = store.stats()["tiers"]
        assert stats[0]["promotions"] == 1 and stats[1]["hits"] == 2
        assert stats[0]["evictions"] >= 1 and stats[1]["bytes_in"] >= 5_000
        await store.aclose()

    asyncio.run(body())


def test_everything_full_is_a_capacity_error() -> None:
    async def body() -> None:
        store = await _memory_store("lru")
        await store.put("a", _value(6_000, 1), pin=True)
        await store.put("b", _value(12_000, 2), pin=True)
        with pytest.raises(CapacityError):
            await store.put("c", _value(100, 3))
        with pytest.raises(CapacityError):
            await store.put("d", _value(20_000, 4))  # larger than any tier
        assert sorted(store.keys()) == ["a", "b"]
        await store.aclose()

    asyncio.run(body())


def test_a_promotion_reuses_the_bytes_the_get_read() -> None:
    async def body() -> None:
        store = await _memory_store("lru")
        await store.put("a", _value(5_000, 1))
        await store.put("b", _value(5_000, 2))  # a now lives in dram only
        into = np.zeros(9_000, np.uint8)  # larger than the object
        await store.get("a", into=into)
        into[:] = 0  # the caller reuses its buffer at once
        await store.drain()
        assert store.tier_of("a") == "hbm"
        assert as_bytes(await store.get("a")) == _value(5_000, 1)
        dram = store.tiers[1]
        assert dram.stats()["hits"] == 1  # the promotion did not read dram a second time
        await store.aclose()

    asyncio.run(body())


def test_concurrent_readers_and_writers_on_one_key(tmp_path: Path) -> None:
    values = [_value(20_000, seed) for seed in range(6)]

    async def body() -> None:
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path / "nvme", create=True)
        store = TieredStore([DramTier("dram", 30_000), nvme], "cost")
        await store.put("k", values[0])

        async def writer(i: int) -> None:
            await store.put("k", values[i])

        async def reader() -> bytes:
            got = await store.get("k")
            assert got is not None
            return as_bytes(got)

        jobs = [writer(i % 6) if i % 3 == 0 else reader() for i in range(40)]
        results = await asyncio.gather(*jobs)
        for got in results:
            if got is not None:
                assert got in values  # old or new, never a mix
        await store.drain()
        final = as_bytes(await store.get("k"))
        assert final in values
        await store.aclose()
        reopened = await NvmeTier.open("nvme", 1 << 20, tmp_path / "nvme", create=True)
        assert as_bytes(await reopened.get("k")) == final  # write-through kept the last put
        await reopened.aclose()

    asyncio.run(body())


def test_write_back_store_flush_makes_everything_durable(tmp_path: Path) -> None:
    async def body() -> None:
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path / "wb", create=True)
        store = TieredStore([DramTier("dram", 64_000), nvme], "lru", write_through=False)
        for i in range(4):
            await store.put(f"k{i}", _value(10_000, i))
        assert all(store.tier_of(f"k{i}") == "dram" for i in range(4))
        assert list(nvme.keys()) == []  # write-back: nothing on NVMe yet
        assert await store.flush() == 4
        assert await store.flush() == 0  # nothing left to write
        await store.aclose()
        reopened = await NvmeTier.open("nvme", 1 << 20, tmp_path / "wb", create=True)
        store2 = TieredStore([DramTier("dram", 64_000), reopened], "lru")
        for i in range(4):
            assert as_bytes(await store2.get(f"k{i}")) == _value(10_000, i)
        await store2.aclose()

    asyncio.run(body())


@pytest.mark.parametrize("policy", ["lru", "lfu", "cost"])
def test_get_many_keeps_the_bookkeeping_of_single_gets(tmp_path: Path, policy: str) -> None:
    """Each get_many counts, per key, the hit and misses a get would on the same state, touches
    the policy of the serving tier, and promotes what it read from below."""
    rng = np.random.default_rng(4)
    trace = [sorted({f"k{int(i)}" for i in rng.zipf(1.3, 6) % 40}) for _ in range(60)]
    sizes = {f"k{i}": 3000 + 100 * i for i in range(40)}

    async def main() -> None:
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        store = TieredStore([DramTier("dram", 40_000), nvme], policy)
        await store.put_many({key: _value(size, size) for key, size in sizes.items()})
        touched: list[str] = []
        touch = store._policies[0].touch
        store._policies[0].touch = lambda key: (touched.append(key), touch(key))  # type: ignore
        promoted: list[str] = []
        promote = store._promote_after_hit
        store._promote_after_hit = lambda key, *a: (promoted.append(key), promote(key, *a))[1]  # type: ignore
        for keys in [*trace, ["absent", "k1", "k1"]]:
            serving = [store.tier_of(key) for key in keys]
            before = [(c.hits, c.misses) for c in store.counters]
            touched.clear()
            promoted.clear()
            got = await store.get_many(keys)
            for key, value in zip(keys, got, strict=True):
                assert (value is None) == (key == "absent")
                if value is not None:
                    assert as_bytes(value) == _value(sizes[key], sizes[key])
            after = [(c.hits, c.misses) for c in store.counters]
            assert after[0][0] - before[0][0] == serving.count("dram")
            assert after[1][0] - before[1][0] == serving.count("nvme")
            assert after[0][1] - before[0][1] == serving.count("nvme")
            assert after[1][1] - before[1][1] == serving.count(None)
            assert touched == [k for k, t in zip(keys, serving, strict=True) if t == "dram"]
            await store.drain()
            below = {key for key, tier in zip(keys, serving, strict=True) if tier == "nvme"}
            assert sorted(promoted) == sorted(below)  # one promotion per key read from below
        await store.aclose()

    asyncio.run(main())
