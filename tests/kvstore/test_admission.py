"""The admission filter against a plain model, and the store that declines blocks.

The model keeps every offer and lookup in lists and recomputes the window, the counters and
the decisions from them; the filter must decide the same for any sequence. The store tests
check what a declined block means to a caller: not cached, not loadable, counted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvstore import KVBlockStore
from kvstore.admission import AdmissionFilter, position_class
from kvstore.policies import make_block_policy
from tests.kvstore.blocks import FP, blocks_of, chain, disk_for, run
from tiers import InvalidArgumentError


class PlainAdmission:
    """The filter's rules, written out plainly."""

    def __init__(self, window: int, ratio: float, min_reuses: int, min_offers: int) -> None:
        self.window, self.ratio = window, ratio
        self.min_reuses, self.min_offers = min_reuses, min_offers
        self.recent: list[tuple[bytes, int]] = []  # oldest first, one entry a hash
        self.offers = [0.0] * 4
        self.reuses = [0.0] * 4
        self.since_halving = 0

    def declines(self, klass: int) -> bool:
        if sum(self.reuses) < self.min_reuses or self.offers[klass] < self.min_offers:
            return False
        return self.reuses[klass] * sum(self.offers) < (
            self.ratio * sum(self.reuses) * self.offers[klass]
        )

    def admit_count(self, length: int, slots: list[int]) -> int:
        for count, slot in enumerate(slots):
            if self.declines(position_class(length - 1 - slot)):
                return count
        return len(slots)

    def offered(self, blocks: list[tuple[bytes, int]]) -> None:
        for block_hash, from_end in blocks:
            klass = position_class(from_end)
            self.offers[klass] += 1
            self.recent = [(h, k) for h, k in self.recent if h != block_hash]
            self.recent.append((block_hash, klass))
        self.recent = self.recent[-self.window :]
        self.since_halving += len(blocks)
        if self.since_halving >= 4 * self.window:  # the counters halve every 4 windows
            self.since_halving = 0
            self.offers = [value / 2 for value in self.offers]
            self.reuses = [value / 2 for value in self.reuses]

    def looked_up(self, hashes: list[bytes]) -> None:
        for block_hash in hashes:
            for index, (held, klass) in enumerate(self.recent):
                if held == block_hash:
                    self.reuses[klass] += 1
                    del self.recent[index]
                    break


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(1, 6), st.lists(st.integers(0, 30), max_size=6)),
        st.tuples(st.just("lookup"), st.integers(0, 0), st.lists(st.integers(0, 30), max_size=6)),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, window=st.integers(1, 12), ratio=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_filter_decides_as_the_plain_model(
    ops: list[tuple[str, int, list[int]]], window: int, ratio: float
) -> None:
    real = AdmissionFilter(window, ratio=ratio, min_reuses=2, min_offers=2)
    plain = PlainAdmission(window, ratio, 2, 2)
    for op, length, ids in ops:
        hashes = [bytes([i]) for i in ids]
        if op == "lookup":
            real.looked_up(hashes)
            plain.looked_up(hashes)
            continue
        hashes = list(dict.fromkeys(hashes))[:length] or [b"\xff"]
        length = max(length, len(hashes))
        slots = list(range(length - len(hashes), length))  # the chain's last blocks are new
        admitted = real.admit_count(length, slots)
        assert admitted == plain.admit_count(length, slots)
        offered = [(h, length - 1 - s) for h, s in zip(hashes, slots, strict=True)]
        real.offered(offered, admitted)
        plain.offered(offered)
        assert len(real._window) <= window
        assert real.offers == plain.offers and real.reuses == plain.reuses
    for klass in range(4):
        assert real.declines(klass) == plain.declines(klass)


def test_a_never_reused_class_is_declined_and_learned_back() -> None:
    gate = AdmissionFilter(1000, ratio=0.25, min_reuses=8, min_offers=8)
    for n in range(40):  # chains of 3: the first two blocks come back, the last never
        blocks = [f"c{n}/{i}".encode() for i in range(3)]
        gate.offered([(h, 2 - i) for i, h in enumerate(blocks)], gate.admit_count(3, [0, 1, 2]))
        gate.looked_up(blocks[:2])
    assert gate.admit_count(3, [0, 1, 2]) == 2 and gate.declines(0)
    assert gate.declined_blocks > 0
    for n in range(200):  # now the last blocks come back too: learned although declined
        blocks = [f"d{n}/{i}".encode() for i in range(3)]
        gate.offered([(h, 2 - i) for i, h in enumerate(blocks)], gate.admit_count(3, [0, 1, 2]))
        gate.looked_up(blocks)
    assert gate.admit_count(3, [0, 1, 2]) == 3


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(InvalidArgumentError):
        AdmissionFilter(0)
    with pytest.raises(InvalidArgumentError):
        AdmissionFilter(10, ratio=1.5)


async def _declining_store(directory: str, capacity_blocks: int = 8) -> KVBlockStore:
    store = await KVBlockStore.open(
        directory, FP, disk_bytes=disk_for(capacity_blocks), policy="prefix-admit"
    )
    gate = AdmissionFilter(64, ratio=0.5, min_reuses=1, min_offers=1)
    gate.offers[0], gate.offers[1], gate.reuses[1] = 10.0, 10.0, 5.0  # last blocks: never
    store._policy.admission = gate
    return store


def test_a_declined_block_is_not_cached_nor_loadable_and_is_counted(tmp_path: Path) -> None:
    async def body() -> None:
        store = await _declining_store(str(tmp_path))
        hashes = chain("declined", 4)
        try:
            assert await store.store(hashes, blocks_of(hashes)) == 3
            assert hashes[3] not in store and all(h in store for h in hashes[:3])
            assert await store.lookup(hashes) == 3
            into = torch.zeros((4, *FP.block_shape), dtype=FP.torch_dtype)
            assert await store.load(hashes, into) == 3
            assert torch.equal(into[:3], blocks_of(hashes[:3]))
            assert not into[3].any()  # the declined block's slot is left alone
            layer = torch.zeros((4, *FP.layer_shape), dtype=FP.torch_dtype)
            assert await store.load_layer(hashes, 1, layer) == 3
            stats = store.stats()
            assert (stats["declined_blocks"], stats["stored_blocks"], stats["blocks"]) == (1, 3, 3)
            assert stats["rejected_blocks"] == 0
            assert await store.pin(hashes) == 3  # only cached blocks pin
            assert await store.store(hashes, blocks_of(hashes)) == 0  # declined again, no error
            assert store.stats()["declined_blocks"] == 2
        finally:
            await store.aclose()

    run(body())


def test_every_policy_name_opens_a_store() -> None:
    async def body(name: str) -> None:
        store = await KVBlockStore.open(None, FP, dram_bytes=4 * FP.block_bytes, policy=name)
        hashes = chain(name, 2)
        try:
            assert await store.store(hashes, blocks_of(hashes)) == 2  # nothing learned yet
            assert await store.lookup(hashes) == 2
        finally:
            await store.aclose()

    for name in ("lru", "cost", "prefix", "prefix-admit"):
        run(body(name))
    assert make_block_policy("prefix-admit").admission is not None
