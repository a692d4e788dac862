"""TinyLfuPolicy: its eviction order and admission against a plain model (aged counts of every
get, the coldest resident first), and the store honouring its admission on promotions."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tiers.memory.dram import DramTier
from tiers.nvme.nvme_tier import NvmeTier
from tiers.store.policy import POLICIES, TinyLfuPolicy, make_policy
from tiers.store.tiered_store import TieredStore
from tiers.testing.tier_contract import as_bytes


class _SmallSample(TinyLfuPolicy):
    SAMPLE_PER_OBJECT = 1  # age often, so the examples reach it
    MIN_SAMPLE = 6


class _Model:
    """Counts as the policy defines them, with none of its heap."""

    def __init__(self, policy: type[TinyLfuPolicy]) -> None:
        self.policy = policy
        self.freq: dict[str, int] = {}
        self.resident: set[str] = set()
        self.events = 0

    def count(self, key: str) -> None:
        self.freq[key] = self.freq.get(key, 0) + 1
        self.events += 1
        if self.events >= self.policy.SAMPLE_PER_OBJECT * len(self.resident) + (
            self.policy.MIN_SAMPLE
        ):
            self.events = 0
            self.freq = {k: v >> 1 for k, v in self.freq.items() if v > 1}

    def coldest(self) -> int | None:
        return min((self.freq.get(k, 0) for k in self.resident), default=None)


_KEYS = [f"k{i}" for i in range(8)]
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "touch", "miss", "evict", "admits"]), st.sampled_from(_KEYS)
    ),
    max_size=120,
)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_victims_and_admission_follow_the_model(ops: list[tuple[str, str]]) -> None:
    policy, model = _SmallSample(), _Model(_SmallSample)
    for op, key in ops:
        if op == "admit" and key not in model.resident:
            if key not in model.freq:
                model.count(key)
            model.resident.add(key)
            policy.admit(key, 100, 0.0)
        elif op == "touch" and key in model.resident:
            model.count(key)
            policy.touch(key)
        elif op == "miss" and key not in model.resident:
            model.count(key)
            policy.note_miss(key)
        elif op == "admits" and key not in model.resident:
            coldest = model.coldest()
            assert policy.admits(key) == (coldest is None or model.freq.get(key, 0) > coldest)
        elif op == "evict":
            victim = next(policy.victims(), None)
            if victim is None:
                assert not model.resident
                continue
            assert victim in model.resident
            assert model.freq.get(victim, 0) == model.coldest()
            model.resident.discard(victim)
            policy.forget(victim)
    # every resident is offered once, coldest first, and a pass that evicts none keeps them
    offered = list(policy.victims())
    assert sorted(offered) == sorted(model.resident)
    counts = [model.freq.get(k, 0) for k in offered]
    assert counts == sorted(counts)
    assert sorted(policy.victims()) == sorted(model.resident)


def test_the_counts_outlive_a_stay_and_age() -> None:
    policy = TinyLfuPolicy()
    policy.admit("hot", 100, 0.0)
    for _ in range(5):
        policy.touch("hot")
    policy.forget("hot")
    policy.admit("cold", 100, 0.0)
    assert policy.admits("hot")  # 6 gets against 1: it comes back
    policy.note_miss("once")
    assert not policy.admits("once")  # 1 get does not beat the resident's 1
    for i in range(TinyLfuPolicy.MIN_SAMPLE + 16):  # enough gets to halve every count
        policy.note_miss(f"x{i}")
    assert policy._freq.get("hot") == 3 and "once" not in policy._freq
    assert make_policy("tinylfu").name == "tinylfu" and "tinylfu" in POLICIES


def _value(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def test_a_full_store_promotes_only_keys_asked_more_than_its_coldest(tmp_path: Path) -> None:
    async def main() -> None:
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        store = TieredStore([DramTier("dram", 3 * 4096), nvme], "tinylfu")
        for i in range(6):
            await store.put(f"k{i}", _value(4096, i))
        in_dram = [k for k in store.keys("k") if store.tier_of(k) == "dram"]
        below = [k for k in store.keys("k") if store.tier_of(k) == "nvme"]
        assert len(in_dram) == 3 and below
        for _ in range(3):  # the residents are asked for
            for key in in_dram:
                assert await store.get(key) is not None
        cold = below[0]
        into = np.zeros(4096, np.uint8)
        for _ in range(3):  # its put and up to 3 gets do not beat a resident's put and 3 gets
            got = await store.get(cold, into=into)
            assert got is into and as_bytes(into) == _value(4096, int(cold[1:]))
            assert store.tier_of(cold) == "nvme" and not store._tasks
        assert sorted(k for k in store.keys("k") if store.tier_of(k) == "dram") == in_dram
        assert store.stats()["tiers"][0]["promotions"] == 0
        assert await store.get(cold) is not None  # its 5th use: more than any resident's 4
        assert store.tier_of(cold) == "dram"
        assert store.stats()["tiers"][0]["promotions"] == 1
        assert store._policies[0].rejected == 3  # type: ignore[attr-defined]
        for i in range(6):
            assert as_bytes(await store.get(f"k{i}")) == _value(4096, i)
        await store.aclose()

    asyncio.run(main())


def test_with_room_every_miss_is_promoted(tmp_path: Path) -> None:
    async def main() -> None:
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path, create=True)
        await nvme.put("a", _value(4096, 1))
        await nvme.aclose()
        nvme = await NvmeTier.open("nvme", 1 << 20, tmp_path)
        store = TieredStore([DramTier("dram", 4 * 4096), nvme], "tinylfu")
        assert store.tier_of("a") == "nvme"
        assert as_bytes(await store.get("a")) == _value(4096, 1)
        assert store.tier_of("a") == "dram"  # one get of a key never seen: room, so it goes up
        await store.aclose()

    asyncio.run(main())
