"""PostingStore over a real file (O_DIRECT, through a real engine) against a dict model: writes,
appends in place and with relocation, drops, checkpoint-style releases, restore from a
snapshot. Invariants after every step: reads return exactly the model's records, live runs and
pending runs never overlap, and every page of the file is live, pending or free exactly once."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)

from tiers.io.buffers import aligned_empty
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import CorruptionError
from tiers.io.factory import create_engine
from vectordb.posting_format import PAGE_BYTES, pages_for, record_bytes
from vectordb.posting_store import PostingItem, PostingStore

DIM = 37  # float32: 176-byte records, 23 to a page; odd, so records carry padding
DTYPE = "float32"
REC = record_bytes(DIM, DTYPE)
T = TypeVar("T")

Records = tuple[np.ndarray, np.ndarray, np.ndarray]  # ids, versions, vectors


class _Maker:
    """Fresh, recognisable records: ids are unique across the whole test."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.next_id = 0

    def __call__(self, n: int) -> Records:
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        versions = self.rng.integers(1, 1 << 31, n, dtype=np.uint32)
        vectors = self.rng.normal(size=(n, DIM)).astype(np.float32)
        return ids, versions, vectors


def _cat(a: Records, b: Records) -> Records:
    return (
        np.concatenate([a[0], b[0]]),
        np.concatenate([a[1], b[1]]),
        np.concatenate([a[2], b[2]]),
    )


async def _open(engine: IOEngine, path: str) -> FileHandle:
    return await engine.open(path, write=True, create=True, direct=True)


def _run_store(
    directory: Path, body: Callable[[IOEngine, FileHandle, PostingStore], Awaitable[T]]
) -> T:
    async def main() -> T:
        engine = create_engine()
        try:
            file = await _open(engine, str(directory / "postings.dat"))
            return await body(engine, file, PostingStore(engine, file, DIM, DTYPE, 0))
        finally:
            await engine.aclose()

    return asyncio.run(main())


async def _assert_lists(store: PostingStore, model: dict[int, Records], pids: list[int]) -> None:
    before = store.counters["pages_read"]
    batch = await store.read(np.array(pids, np.int64))
    want_pages = sum(pages_for(len(model[p][0]), REC) for p in pids)
    assert store.counters["pages_read"] - before == want_pages
    assert batch.pids.tolist() == pids
    assert len(batch.starts) == len(pids) + 1
    for k, pid in enumerate(pids):
        rec = batch.records[batch.starts[k] : batch.starts[k + 1]]
        ids, versions, vectors = model[pid]
        np.testing.assert_array_equal(rec["id"], ids)
        np.testing.assert_array_equal(rec["version"], versions)
        np.testing.assert_array_equal(rec["vector"], vectors)


def _runs(store: PostingStore) -> dict[int, tuple[int, int]]:
    live = np.flatnonzero(store.capacity > 0)
    return {int(p): (int(store.start[p]), pages_for(int(store.capacity[p]), REC)) for p in live}


def _check_space(store: PostingStore) -> None:
    """Live and pending runs are disjoint, inside the file, and with the free pages they
    account for every page of the file exactly once."""
    runs = list(_runs(store).values()) + list(store.space.pending_runs())
    pages = store.space.file_pages
    owner = np.zeros(pages, np.int64)
    for start, n in runs:
        assert start >= 0 and start + n <= pages, (start, n, pages)
        owner[start : start + n] += 1
    assert owner.max(initial=0) <= 1, "two runs share a page"
    assert int(owner.sum()) + store.space.stats()["free_pages"] == pages


class PostingStoreMachine(RuleBasedStateMachine):
    lists = Bundle("lists")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="posting-store-"))
        self.loop = asyncio.new_event_loop()
        self.engine = create_engine()
        self.file = self._run(_open(self.engine, str(self.dir / "postings.dat")))
        self.store = PostingStore(self.engine, self.file, DIM, DTYPE, 0)
        self.model: dict[int, Records] = {}
        self.make = _Maker()
        self.next_pid = 0
        self.freed: list[tuple[int, int]] = []  # runs given up since the last checkpoint

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self._run(self.engine.aclose())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @initialize(target=lists)
    def first_list(self) -> int:
        return self._write_new(5, 0)

    def _write_new(self, n: int, extra: int) -> int:
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        records = self.make(n)
        self._run(self.store.write([PostingItem(pid, *records, capacity=n + extra)]))
        self.model[pid] = records
        return pid

    @rule(target=lists, n=st.integers(0, 60), extra=st.integers(0, 40))
    def write_new(self, n: int, extra: int) -> int:
        return self._write_new(n, extra)

    @rule(data=st.data(), sizes=st.lists(st.integers(0, 50), min_size=1, max_size=4))
    def rewrite(self, data: st.DataObject, sizes: list[int]) -> None:
        """Several lists replaced in one call (copy-on-write: each gets a new run)."""
        pids = sorted(self.model)
        chosen = data.draw(st.lists(st.sampled_from(pids), min_size=1, max_size=len(sizes),
                                    unique=True))  # fmt: skip
        old = _runs(self.store)
        items = []
        for pid, n in zip(chosen, sizes, strict=False):
            records = self.make(n)
            items.append(PostingItem(pid, *records))
            self.model[pid] = records
        self._run(self.store.write(items))
        new = _runs(self.store)
        for item in items:
            assert new[item.pid][0] != old[item.pid][0], "a rewrite never reuses its own run"
            self.freed.append(old[item.pid])

    @rule(data=st.data(), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4))
    def append(self, data: st.DataObject, sizes: list[int]) -> None:
        pids = sorted(self.model)
        chosen = data.draw(st.lists(st.sampled_from(pids), min_size=1, max_size=len(sizes),
                                    unique=True))  # fmt: skip
        before = _runs(self.store)
        room = {p: int(self.store.capacity[p] - self.store.count[p]) for p in chosen}
        items = []
        for pid, n in zip(chosen, sizes, strict=False):
            records = self.make(n)
            items.append(PostingItem(pid, *records))
            self.model[pid] = _cat(self.model[pid], records)
        self._run(self.store.append(items))
        after = _runs(self.store)
        for item in items:
            moved = len(item.ids) > room[item.pid]
            assert (after[item.pid] != before[item.pid]) == moved, item.pid
            if moved:
                self.freed.append(before[item.pid])

    @rule(pid=consumes(lists))
    def drop(self, pid: int) -> None:
        if len(self.model) == 1:  # keep one list to append to
            return
        self.freed.append(_runs(self.store)[pid])
        self.store.drop(pid)
        del self.model[pid]
        assert self.store.capacity[pid] == 0

    @rule()
    def checkpoint(self) -> None:
        """A committed checkpoint: pending runs become free."""
        self.store.space.release_pending(self.store.space.take_pending())
        assert self.store.space.stats()["pending_free_runs"] == 0
        self.freed.clear()

    @rule()
    def restore_from_snapshot(self) -> None:
        """Reopen: a fresh store over the same file, from the checkpointed directory."""
        self.checkpoint()
        self._run(self.store.sync())
        snap = {k: v.copy() for k, v in self.store.snapshot().items()}
        pages = self.store.space.file_pages
        self.store = PostingStore(self.engine, self.file, DIM, DTYPE, pages)
        self.store.restore(snap["start"], snap["capacity"], snap["count"])

    @rule(data=st.data())
    def read_some(self, data: st.DataObject) -> None:
        """Any order, repeats allowed, in one call."""
        pids = data.draw(st.lists(st.sampled_from(sorted(self.model)), max_size=6))
        self._run(_assert_lists(self.store, self.model, pids))

    @invariant()
    def agrees(self) -> None:
        self._run(_assert_lists(self.store, self.model, sorted(self.model)))
        _check_space(self.store)
        assert self.store.stats()["postings"] == len(self.model)
        # a run freed since the last checkpoint is not handed out again before the next one
        for start, n in _runs(self.store).values():
            for f_start, f_n in self.freed:
                assert start + n <= f_start or f_start + f_n <= start, ((start, n), (f_start, f_n))


TestPostingStoreMachine = PostingStoreMachine.TestCase
TestPostingStoreMachine.settings = settings(max_examples=30, stateful_step_count=15, deadline=None)


def test_write_and_read_many_lists_in_one_call(tmp_path: Path) -> None:
    make = _Maker(1)
    sizes = [0, 1, 23, 24, 50, 3, 100]
    model = {pid * 5 + 2: make(n) for pid, n in enumerate(sizes)}

    async def body(_e: IOEngine, _f: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *rec) for pid, rec in model.items()])
        assert store.counters["pages_written"] == sum(pages_for(len(r[0]), REC)
                                                      for r in model.values())  # fmt: skip
        pids = list(model)[::-1]
        await _assert_lists(store, model, pids)
        reads = store.counters["posting_reads"]
        assert reads == len(pids) - 1  # the empty list needs no I/O
        _check_space(store)

    _run_store(tmp_path, body)


def test_append_in_place_keeps_earlier_records_and_touches_only_tail_pages(
    tmp_path: Path,
) -> None:
    make = _Maker(2)

    async def body(_e: IOEngine, _f: FileHandle, store: PostingStore) -> None:
        first = make(30)  # 30 * 176 bytes: page 0 full, page 1 partly used
        await store.write([PostingItem(1, *first, capacity=200)])
        start = int(store.start[1])
        written = store.counters["pages_written"]
        model = {1: first}
        for n in [1, 10, 40, 2]:
            more = make(n)
            old_bytes = int(store.count[1]) * REC
            await store.append([PostingItem(1, *more)])
            model[1] = _cat(model[1], more)
            assert int(store.start[1]) == start, "in place"
            new_bytes = old_bytes + n * REC
            touched = -(-new_bytes // PAGE_BYTES) - old_bytes // PAGE_BYTES
            assert store.counters["pages_written"] - written == touched
            written = store.counters["pages_written"]
            await _assert_lists(store, model, [1])
        assert store.space.stats()["pending_free_runs"] == 0

    _run_store(tmp_path, body)


def test_append_beyond_capacity_relocates(tmp_path: Path) -> None:
    make = _Maker(3)

    async def body(_e: IOEngine, _f: FileHandle, store: PostingStore) -> None:
        model = {1: make(20), 2: make(3)}
        await store.write([PostingItem(p, *r) for p, r in model.items()])
        old_start = int(store.start[1])
        more = {1: make(30), 2: make(1)}
        await store.append([PostingItem(p, *r) for p, r in more.items()], headroom=0.5)
        model = {p: _cat(model[p], more[p]) for p in model}
        assert int(store.start[1]) != old_start
        assert int(store.capacity[1]) >= 50 + 25  # headroom for later appends
        assert store.space.stats()["pending_free_runs"] >= 1  # the old run waits
        await _assert_lists(store, model, [1, 2])
        _check_space(store)

    _run_store(tmp_path, body)


def test_dropped_run_not_reused_before_release(tmp_path: Path) -> None:
    make = _Maker(4)

    async def body(_e: IOEngine, _f: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(1, *make(40)), PostingItem(2, *make(40))])
        run = (int(store.start[1]), pages_for(int(store.capacity[1]), REC))
        store.drop(1)
        store.drop(1)  # twice: no double free
        assert store.space.stats()["pending_free_runs"] == 1
        # allocations of every size avoid the pending run
        taken = [await store.space.allocate(run[1]) for _ in range(5)]
        taken += [await store.space.allocate(1) for _ in range(5)]
        for start in taken:
            assert not run[0] <= start < run[0] + run[1]
        await store.write([PostingItem(3, *make(40))])
        assert int(store.start[3]) != run[0]
        # after the checkpoint commits the run is free again: lowest address first
        store.space.release_pending(store.space.take_pending())
        assert await store.space.allocate(run[1]) == run[0]

    _run_store(tmp_path, body)


def test_restore_rebuilds_free_space_without_overlap(tmp_path: Path) -> None:
    make = _Maker(5)
    model: dict[int, Records] = {p: make(n) for p, n in enumerate([5, 60, 0, 23, 90, 7])}

    async def first(_e: IOEngine, _f: FileHandle, store: PostingStore) -> tuple[Any, int]:
        await store.write([PostingItem(p, *r, capacity=len(r[0]) + p * 10)
                           for p, r in model.items()])  # fmt: skip
        store.drop(0)
        store.drop(3)  # holes in the middle of the file
        await store.sync()
        return store.snapshot(), store.space.file_pages

    snap, pages = _run_store(tmp_path, first)
    del model[0], model[3]

    async def second(engine: IOEngine, file: FileHandle, _s: PostingStore) -> None:
        store = PostingStore(engine, file, DIM, DTYPE, pages)
        store.restore(snap["start"], snap["capacity"], snap["count"])
        assert store.snapshot()["start"].tolist() == snap["start"].tolist()
        assert store.snapshot()["count"].tolist() == snap["count"].tolist()
        await _assert_lists(store, model, sorted(model))
        _check_space(store)
        used = sum(n for _, n in _runs(store).values())
        assert store.space.stats()["free_pages"] == pages - used
        # new lists land in the holes or past the end, never over a restored list
        for pid in range(10, 20):
            model[pid] = make(15 + pid)
            await store.write([PostingItem(pid, *model[pid])])
            _check_space(store)
        await _assert_lists(store, model, sorted(model))

    _run_store(tmp_path, second)


def test_restore_refuses_overlapping_runs(tmp_path: Path) -> None:
    async def body(engine: IOEngine, file: FileHandle, _s: PostingStore) -> None:
        store = PostingStore(engine, file, DIM, DTYPE, 10)
        with pytest.raises(ValueError, match="overlaps"):
            store.restore(np.array([0, 1]), np.array([50, 5], np.int32), np.array([1, 1]))

    _run_store(tmp_path, body)


def test_read_of_a_corrupt_page_names_the_list(tmp_path: Path) -> None:
    make = _Maker(6)

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(4, *make(10)), PostingItem(9, *make(10))])
        await store.sync()
        page = aligned_empty(PAGE_BYTES)
        at = np.array([int(store.start[9]) * PAGE_BYTES])
        await engine.read_batch(file, page, at, PAGE_BYTES)
        page[3 * REC + 40] ^= 0x10  # one bit of record 3's vector
        await engine.write_batch(file, page, at, PAGE_BYTES)
        with pytest.raises(CorruptionError, match=r"posting list 9: record 3\b"):
            await store.read(np.array([4, 9]))
        await store.read(np.array([4]))  # the other list is fine

    _run_store(tmp_path, body)


def test_a_run_holds_as_many_records_as_its_pages_fit(tmp_path: Path) -> None:
    """A list written with no room asked for still fills its last page in place (the page is
    read and written anyway); the first record past the page moves it."""
    make = _Maker(9)

    async def body(_e: IOEngine, _f: FileHandle, store: PostingStore) -> None:
        model = {1: make(30)}  # 30 * 176 bytes: 2 pages, room for 46
        await store.write([PostingItem(1, *model[1])])
        start = int(store.start[1])
        assert int(store.capacity[1]) == 2 * PAGE_BYTES // REC == 46
        more = make(16)
        await store.append([PostingItem(1, *more)])
        model[1] = _cat(model[1], more)
        assert int(store.start[1]) == start, "in place, inside the last page"
        more = make(1)
        await store.append([PostingItem(1, *more)])
        model[1] = _cat(model[1], more)
        assert int(store.start[1]) != start, "moved"
        await _assert_lists(store, model, [1])
        _check_space(store)

    _run_store(tmp_path, body)
