"""KVBlockStore under random stores, lookups, loads, pins, evictions and reopens.

Which blocks a full store evicts is the policy's choice, so the plain model here is what must
hold whatever it chooses: the cap is never exceeded, a pinned block is never evicted, a store
that fits keeps the whole chain, every cached block loads as exactly the bytes stored under its
hash, lookups agree with the set of cached blocks, and a reopen keeps that set.
"""

from __future__ import annotations

import asyncio
import tempfile
from typing import Any

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvstore import KVBlockStore
from kvstore.admission import AdmissionFilter
from tests.kvstore.blocks import BLOCK_BYTES, FP, blocks_of, chain, disk_for

CAPACITY_BLOCKS = 10
CHAINS = [chain(f"c{i}", 6, root=chain("root", 1) if i % 2 else None) for i in range(6)]


class BlockStoreMachine(RuleBasedStateMachine):
    policy = "prefix"

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.directory = tempfile.TemporaryDirectory(prefix="tierkit-kv-")
        self.store = self._open()
        self.pinned: dict[bytes, int] = {}

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def _open(self) -> KVBlockStore:
        return self.run(
            KVBlockStore.open(
                self.directory.name, FP, disk_bytes=disk_for(CAPACITY_BLOCKS),
                dram_bytes=3 * BLOCK_BYTES, policy=self.policy,
            )
        )  # fmt: skip

    @rule(which=st.integers(0, 5), start=st.integers(0, 5), length=st.integers(1, 6))
    def store_chain(self, which: int, start: int, length: int) -> None:
        hashes = CHAINS[which][start : start + length]
        parent = CHAINS[which][start - 1] if start else None
        room = CAPACITY_BLOCKS - sum(1 for h in self.pinned if h not in hashes)
        declined_before = self.store.stats()["declined_blocks"]
        fresh = [h for h in hashes if h not in self.store]
        stored = self.run(self.store.store(hashes, blocks_of(hashes), parent=parent))
        declined = self.store.stats()["declined_blocks"] - declined_before
        new = [h for h in hashes if h in self.store]
        assert stored <= len(hashes)
        if len(hashes) <= room:  # it fitted: the whole chain is cached, but what was declined
            assert len(new) + declined == len(hashes)
            assert all(h not in self.store for h in fresh[len(fresh) - declined :])

    @rule(which=st.integers(0, 5))
    def lookup_and_load(self, which: int) -> None:
        hashes = CHAINS[which]
        expected = next((i for i, h in enumerate(hashes) if h not in self.store), len(hashes))
        assert self.run(self.store.lookup(hashes)) == expected
        into = torch.zeros((len(hashes), *FP.block_shape), dtype=FP.torch_dtype)
        assert self.run(self.store.load(hashes, into)) == expected
        assert torch.equal(into[:expected], blocks_of(hashes[:expected]))

    @rule(which=st.integers(0, 5), layer=st.integers(0, 1))
    def load_layer(self, which: int, layer: int) -> None:
        hashes = CHAINS[which]
        into = torch.zeros((len(hashes), *FP.layer_shape), dtype=FP.torch_dtype)
        loaded = self.run(self.store.load_layer(hashes, layer, into))
        assert torch.equal(into[:loaded], blocks_of(hashes[:loaded])[:, layer])

    @precondition(lambda self: sum(self.pinned.values()) < 4)
    @rule(which=st.integers(0, 5), index=st.integers(0, 5))
    def pin(self, which: int, index: int) -> None:
        block_hash = CHAINS[which][index]
        if self.run(self.store.pin([block_hash])):
            self.pinned[block_hash] = self.pinned.get(block_hash, 0) + 1

    @precondition(lambda self: self.pinned)
    @rule()
    def unpin_one(self) -> None:
        block_hash = next(iter(self.pinned))
        assert self.run(self.store.unpin([block_hash])) == 1
        self.pinned[block_hash] -= 1
        if not self.pinned[block_hash]:
            del self.pinned[block_hash]

    @rule(which=st.integers(0, 5), start=st.integers(0, 5))
    def evict(self, which: int, start: int) -> None:
        hashes = CHAINS[which][start:]
        cached = [h for h in hashes if h in self.store and h not in self.pinned]
        assert self.run(self.store.evict(hashes)) == len(cached)

    @precondition(lambda self: not self.pinned)  # pins are not kept across a restart
    @rule()
    def reopen(self) -> None:
        before = set(self.store._index.blocks)
        self.run(self.store.aclose())
        self.store = self._open()
        assert set(self.store._index.blocks) == before

    @invariant()
    def bounded_and_pins_kept(self) -> None:
        for tier in self.store.stats()["tiers"].values():
            assert tier["used_bytes"] <= tier["capacity_bytes"]
        assert len(self.store) <= CAPACITY_BLOCKS
        for block_hash in self.pinned:
            assert block_hash in self.store

    def teardown(self) -> None:
        self.run(self.store.aclose())
        self.loop.close()
        self.directory.cleanup()


_SETTINGS = settings(
    max_examples=15, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


class AdmitBlockStoreMachine(BlockStoreMachine):
    """``prefix-admit`` with a filter that starts out having learned that a chain's last
    block is never reused, so that it declines within a short run (and learns on)."""

    policy = "prefix-admit"

    def _open(self) -> KVBlockStore:
        store = super()._open()
        gate = AdmissionFilter(16, ratio=0.5, min_reuses=1, min_offers=1)
        gate.offers[0], gate.offers[1], gate.reuses[1] = 40.0, 40.0, 20.0
        store._policy.admission = gate
        return store


class LruBlockStoreMachine(BlockStoreMachine):
    policy = "lru"


class CostBlockStoreMachine(BlockStoreMachine):
    policy = "cost"


TestPrefixBlockStore = BlockStoreMachine.TestCase
TestPrefixBlockStore.settings = _SETTINGS
TestAdmitBlockStore = AdmitBlockStoreMachine.TestCase
TestAdmitBlockStore.settings = _SETTINGS
TestLruBlockStore = LruBlockStoreMachine.TestCase
TestLruBlockStore.settings = settings(_SETTINGS, max_examples=8)
TestCostBlockStore = CostBlockStoreMachine.TestCase
TestCostBlockStore.settings = settings(_SETTINGS, max_examples=8)
