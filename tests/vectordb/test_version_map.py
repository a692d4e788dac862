"""VersionMap against a plain dict model: random operation sequences (a hypothesis state
machine, with the merge threshold lowered so merges happen often) and large batches that cross
the real threshold. Every call passes unique ids, as the index does (insert validates them,
delete deduplicates)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from vectordb import version_map
from vectordb.version_map import _MERGE_AT, DELETED, VersionMap

_D = int(DELETED)
_IDS = st.lists(st.integers(-5, 60), min_size=0, max_size=12, unique=True)
_PROBE = np.arange(-8, 64, dtype=np.int64)


def _alive(v: int) -> bool:
    return v != 0 and not v & _D


class _Model:
    """The plain version map: id -> current version (0: never seen)."""

    def __init__(self) -> None:
        self.v: dict[int, int] = {}

    def get(self, ids: list[int]) -> list[int]:
        return [self.v.get(i, 0) for i in ids]

    def live(self) -> int:
        return sum(_alive(v) for v in self.v.values())


def _check_against(vm: VersionMap, model: _Model, probe: np.ndarray) -> None:
    got = vm.get(probe)
    assert got.dtype == np.uint32
    want = model.get(probe.tolist())
    assert got.tolist() == want
    assert vm.is_live(probe).tolist() == [_alive(v) for v in want]
    assert vm.live_count == model.live()
    assert len(vm) == len(model.v)


class VersionMapMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.vm = VersionMap()
        self.model = _Model()
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(version_map, "_MERGE_AT", 5)  # merge often

    def teardown(self) -> None:
        self.patch.undo()

    @rule(ids=_IDS)
    def write(self, ids: list[int]) -> None:
        """What insert / reassign do: write copies at next_versions, then set."""
        arr = np.array(ids, np.int64)
        nxt = self.vm.next_versions(arr)
        want = [(v & ~_D) + 1 for v in self.model.get(ids)]
        assert nxt.tolist() == want
        self.vm.set(arr, nxt)
        self.model.v.update(zip(ids, want, strict=True))

    @rule(ids=_IDS, data=st.data())
    def set_any(self, ids: list[int], data: st.DataObject) -> None:
        versions = data.draw(st.lists(st.sampled_from([1, 2, 7, _D | 1, _D | 3, 0xFFFF]),
                                      min_size=len(ids), max_size=len(ids)))  # fmt: skip
        self.vm.set(np.array(ids, np.int64), np.array(versions, np.uint32))
        self.model.v.update(zip(ids, versions, strict=True))

    @rule(ids=_IDS)
    def delete(self, ids: list[int]) -> None:
        was_live = self.vm.delete(np.array(ids, np.int64))
        want = [_alive(v) for v in self.model.get(ids)]
        assert was_live.tolist() == want
        for i, live in zip(ids, want, strict=True):
            if live:
                self.model.v[i] |= _D

    @rule(ids=_IDS, data=st.data())
    def valid(self, ids: list[int], data: st.DataObject) -> None:
        current = self.model.get(ids)
        asked = [v if data.draw(st.booleans()) else v ^ 1 for v in current]
        got = self.vm.valid(np.array(ids, np.int64), np.array(asked, np.uint32))
        assert got.tolist() == [a == c for a, c in zip(asked, current, strict=True)]

    @rule()
    def snapshot_restore(self) -> None:
        ids, versions = self.vm.snapshot()
        assert (np.diff(ids) > 0).all()  # sorted, unique
        assert dict(zip(ids.tolist(), versions.tolist(), strict=True)) == self.model.v
        self.vm = VersionMap(ids.copy(), versions.copy())  # as the checkpoint's np.load gives

    @precondition(lambda self: len(self.model.v) > 0)
    @rule(data=st.data())
    def reinsert_continues_versions(self, data: st.DataObject) -> None:
        i = data.draw(st.sampled_from(sorted(self.model.v)))
        arr = np.array([i], np.int64)
        self.vm.delete(arr)
        before = self.model.v[i] & ~_D
        nxt = self.vm.next_versions(arr)
        assert int(nxt[0]) == before + 1
        assert not self.vm.is_live(arr)[0]
        self.vm.set(arr, nxt)
        self.model.v[i] = before + 1
        assert self.vm.is_live(arr)[0]
        assert not self.vm.valid(arr, np.array([before], np.uint32))[0]  # old copies stay dead

    @invariant()
    def agrees(self) -> None:
        _check_against(self.vm, self.model, _PROBE)


TestVersionMapMachine = VersionMapMachine.TestCase
TestVersionMapMachine.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)


def test_empty_map() -> None:
    vm = VersionMap()
    ids = np.array([0, 5, -1], np.int64)
    assert vm.get(ids).tolist() == [0, 0, 0]
    assert not vm.is_live(ids).any()
    assert vm.next_versions(ids).tolist() == [1, 1, 1]
    assert vm.delete(ids).tolist() == [False] * 3
    assert vm.live_count == 0 and len(vm) == 0
    snap_ids, snap_versions = vm.snapshot()
    assert len(snap_ids) == len(snap_versions) == 0


def test_crossing_the_real_merge_threshold() -> None:
    """Batches around _MERGE_AT ids: the delta is merged into the sorted arrays, in several
    steps, and every later lookup (array hits and delta hits mixed) agrees with the model."""
    rng = np.random.default_rng(0)
    vm, model = VersionMap(), _Model()
    universe = rng.permutation(4 * _MERGE_AT).astype(np.int64) * 3 - 1000
    batches = [universe[: _MERGE_AT - 1], universe[_MERGE_AT - 1 : _MERGE_AT + 10]]
    batches += [universe[_MERGE_AT + 10 : 3 * _MERGE_AT], universe[3 * _MERGE_AT :]]
    for batch in batches:
        v = vm.next_versions(batch)
        vm.set(batch, v)
        model.v.update(zip(batch.tolist(), v.tolist(), strict=True))
        probe = rng.choice(universe, 3000)
        probe = np.concatenate([probe, probe + 1])  # misses between stored ids
        _check_against(vm, model, probe)
    assert len(vm._delta) < _MERGE_AT  # merged at least once along the way
    # deletes and rewrites of ids in both the sorted part and the delta
    gone = rng.choice(universe, 2 * _MERGE_AT, replace=False)
    assert vm.delete(gone).all()
    for i in gone.tolist():
        model.v[i] |= _D
    back = gone[: _MERGE_AT + 5]
    vm.set(back, vm.next_versions(back))
    for i in back.tolist():
        model.v[i] = (model.v[i] & ~_D) + 1
    _check_against(vm, model, np.concatenate([universe, universe + 1]))
    ids, versions = vm.snapshot()
    assert (np.diff(ids) > 0).all()
    restored = VersionMap(ids.copy(), versions.copy())
    _check_against(restored, model, universe)
    assert restored.live_count == len(universe) - len(gone) + len(back)


def test_versions_survive_a_delete_and_restore() -> None:
    vm = VersionMap()
    ids = np.array([10, 20, 30], np.int64)
    vm.set(ids, np.array([1, 4, 9], np.uint32))
    vm.delete(np.array([20], np.int64))
    restored = VersionMap(*[a.copy() for a in vm.snapshot()])
    assert restored.get(ids).tolist() == [1, 4 | _D, 9]
    assert restored.live_count == 2
    assert restored.next_versions(ids).tolist() == [2, 5, 10]
    assert not restored.valid(np.array([20]), np.array([4]))[0]


@settings(max_examples=40, deadline=None)
@given(
    base=st.integers(-5, 5),
    n=st.integers(1, 50),
    gap=st.booleans(),
    probe=st.lists(st.integers(-10, 70), max_size=40),
)
def test_lookup_by_range_or_search_agrees_with_a_dict(
    base: int, n: int, gap: bool, probe: list[int]
) -> None:
    """Ids forming one range are looked up by indexing, others by search: same answers."""
    ids = np.arange(base, base + n, dtype=np.int64)
    if gap:
        ids[n // 2 :] += 3
    versions = np.arange(1, n + 1, dtype=np.uint32)
    model = dict(zip(ids.tolist(), versions.tolist(), strict=True))
    got = VersionMap(ids, versions).get(np.array(probe, np.int64))
    assert got.tolist() == [model.get(i, 0) for i in probe]
