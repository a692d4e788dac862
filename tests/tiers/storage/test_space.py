"""GrowableSpace against a plain model that knows the state of every unit: a run handed out is
made of free units only (never owned, pending in an epoch not yet released, or freed under a
pin), the free count matches, growth takes only what a request lacks, ``try_allocate`` finds a
run whenever one is free, and ``free_many`` (merged runs) frees as ``free`` of each would."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tiers.io.errors import InvalidArgumentError
from tiers.storage.space import GrowableSpace

ALIGN = 4
STEP = 16  # the least the model's backing grows by


class SpaceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.space = GrowableSpace(1 << 20, ALIGN, self._grow)
        self.end = 0  # backing is [0, end)
        self.state: list[str] = []  # per unit: free, owned, pending (deferred), unpin
        self.owned: list[tuple[int, int]] = []
        self.pins: dict[int, int] = {}  # start -> pins
        self.waiting: dict[int, int] = {}  # start -> size, freed at the last unpin
        self.pending: list[tuple[int, int]] = []  # deferred in the current epoch
        self.sealed: dict[int, list[tuple[int, int]]] = {}  # ended epoch -> deferred runs

    async def _grow(self, size: int) -> Iterable[tuple[int, int]]:
        tail = self.space.free_before(self.end)
        assert tail < size, "grew although a free tail could hold the run"
        new = max(size - tail, STEP)
        start, self.end = self.end, self.end + new
        self.state += ["free"] * new
        return [(start, new)]

    def _set(self, start: int, size: int, what: str) -> None:
        self.state[start : start + size] = [what] * size

    def _free(self, start: int, size: int) -> None:
        if start in self.pins:
            self.waiting[start] = size
            self._set(start, size, "unpin")
        else:
            self._set(start, size, "free")

    @rule(size=st.integers(1, 40))
    def allocate(self, size: int) -> None:
        start = self.loop.run_until_complete(self.space.allocate(size))
        rounded = -(-size // ALIGN) * ALIGN
        assert start % ALIGN == 0 and start + rounded <= self.end
        taken = set(self.state[start : start + rounded])
        assert taken == {"free"}, f"run {start}+{rounded} reuses units that are {taken}"
        self._set(start, rounded, "owned")
        self.owned.append((start, rounded))

    @precondition(lambda self: self.owned)
    @rule(data=st.data(), deferred=st.booleans())
    def free(self, data: st.DataObject, deferred: bool) -> None:
        start, size = self.owned.pop(data.draw(st.integers(0, len(self.owned) - 1)))
        self.space.free(start, size, deferred=deferred)
        if deferred:
            self.pending.append((start, size))
            self._set(start, size, "pending")
        else:
            self._free(start, size)

    @rule(size=st.integers(1, 60))
    def try_allocate(self, size: int) -> None:
        start = self.space.try_allocate(size)
        rounded = -(-size // ALIGN) * ALIGN
        if start is None:
            runs = "".join("f" if unit == "free" else "." for unit in self.state).split(".")
            assert max(map(len, runs), default=0) < rounded, f"a free run of {rounded} was missed"
            return
        assert set(self.state[start : start + rounded]) == {"free"}
        self._set(start, rounded, "owned")
        self.owned.append((start, rounded))

    @precondition(lambda self: self.owned)
    @rule(data=st.data())
    def free_many(self, data: st.DataObject) -> None:
        picks = data.draw(st.sets(st.integers(0, len(self.owned) - 1), min_size=1))
        runs = [self.owned[i] for i in sorted(picks)]
        self.owned = [run for i, run in enumerate(self.owned) if i not in picks]
        self.space.free_many(runs)
        for start, size in runs:
            self._free(start, size)

    @precondition(lambda self: self.owned)
    @rule(data=st.data())
    def pin(self, data: st.DataObject) -> None:
        start, _ = self.owned[data.draw(st.integers(0, len(self.owned) - 1))]
        self.space.pin(start)
        self.pins[start] = self.pins.get(start, 0) + 1

    @precondition(lambda self: self.pins)
    @rule(data=st.data())
    def unpin(self, data: st.DataObject) -> None:
        start = data.draw(st.sampled_from(sorted(self.pins)))
        self.space.unpin(start)
        self.pins[start] -= 1
        if not self.pins[start]:
            del self.pins[start]
            if start in self.waiting:
                self._set(start, self.waiting.pop(start), "free")

    @rule()
    def advance_epoch(self) -> None:
        self.sealed[self.space.advance_epoch()] = self.pending
        self.pending = []

    @precondition(lambda self: self.sealed)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        epoch = data.draw(st.sampled_from(sorted(self.sealed)))
        self.space.release_pending(epoch)
        for start, size in self.sealed.pop(epoch):
            self._free(start, size)

    @invariant()
    def counts_match(self) -> None:
        stats = self.space.stats()
        assert stats["free"] == self.state.count("free")
        assert self.space.pending == sum(size for _, size in self.pending)
        assert stats["frees_at_unpin"] == len(self.waiting)
        assert stats["backed"] == self.end
        held = sorted(self.pending + [run for runs in self.sealed.values() for run in runs])
        assert sorted(self.space.pending_runs()) == held

    def teardown(self) -> None:
        self.loop.close()


TestSpaceMachine = SpaceMachine.TestCase
TestSpaceMachine.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


def _run(space: GrowableSpace, size: int) -> int:
    return asyncio.run(space.allocate(size))


async def _no_growth(size: int) -> Iterable[tuple[int, int]]:
    raise AssertionError(f"grew for {size}")


def test_adopt_frees_the_gaps_and_names_impossible_runs() -> None:
    space = GrowableSpace(1 << 20, 4, _no_growth)
    used = [(0, 8, "a"), (4, 4, "overlaps a"), (6, 4, "misaligned"), (20, 8, "b"), (60, 8, "out")]
    assert space.adopt(0, 64, used) == ["overlaps a", "misaligned", "out"]
    assert space.stats()["free"] == 64 - 16 and space.free_before(64) == 64 - 28
    assert _run(space, 12) == 8  # the first hole, between a and b


def test_a_deferred_free_waits_for_its_epoch_and_a_pin_for_its_unpin() -> None:
    space = GrowableSpace(1 << 20, 1, _no_growth)
    space.adopt(0, 10, [(0, 10, None)])
    space.free(0, 4, deferred=True)
    epoch = space.advance_epoch()
    space.free(4, 2, deferred=True)  # the next epoch
    assert space.stats()["free"] == 0 and space.pending_runs() == [(0, 4), (4, 2)]
    space.pin(0)
    space.release_pending(epoch)
    assert space.stats()["free"] == 0 and space.stats()["frees_at_unpin"] == 1
    space.unpin(0)
    assert space.stats()["free"] == 4 and space.pending_runs() == [(4, 2)]
    with pytest.raises(InvalidArgumentError, match="has not ended"):
        space.release_pending(epoch + 1)


def test_growth_is_serialised_and_failed_growth_takes_nothing() -> None:
    calls: list[int] = []

    async def grow(size: int) -> Iterable[tuple[int, int]]:
        calls.append(size)
        await asyncio.sleep(0)
        if len(calls) == 1:
            raise OSError("no room")
        return [(sum(calls[1:]) - size, size)]

    space = GrowableSpace(1 << 20, 1, grow)
    with pytest.raises(OSError):
        _run(space, 5)
    assert space.stats()["free"] == 0 and space.stats()["backed"] == 0

    async def two() -> list[int]:
        return list(await asyncio.gather(space.allocate(5), space.allocate(5)))

    assert sorted(asyncio.run(two())) == [0, 5]
    assert calls == [5, 5, 5]  # the second caller grew only once the first had
