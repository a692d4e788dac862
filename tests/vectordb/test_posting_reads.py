"""PostingRead (a search's grouped read) on a real file through a real engine: every list is
handed over exactly once whatever the grouping, records equal what was written, a corrupt
page is caught (by ``groups()`` or by ``verify`` when the caller checks), a pooled read
reuses the buffer a finished one handed back, and lists back to back in the file are read by
one request (``coalesce``, checked against a byte-map model)."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.vectordb.test_posting_store import REC, _Maker, _run_store
from tiers.io.buffers import aligned_empty
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import CorruptionError
from vectordb.posting_format import PAGE_BYTES
from vectordb.posting_reads import MAX_REQUEST_BYTES, bridged_layout, coalesce
from vectordb.posting_store import SPARE_LIMIT_BYTES, PostingItem, PostingStore


async def _collect(store: PostingStore, pids: np.ndarray, n_groups: int) -> dict[int, np.ndarray]:
    read = store.begin_read(pids, n_groups)
    seen: dict[int, np.ndarray] = {}
    async with aclosing(read.groups()) as groups:
        async for first, stop in groups:
            for offset, records in enumerate(read.views(first, stop)):
                assert first + offset not in seen, "a list handed over twice"
                seen[first + offset] = records.copy()
    assert sorted(seen) == list(range(len(pids)))
    return seen


@settings(max_examples=15, deadline=None)
@given(sizes=st.lists(st.integers(0, 60), min_size=1, max_size=12), groups=st.integers(1, 7))
def test_every_list_once_whatever_the_grouping(tmp_path_factory, sizes, groups) -> None:  # type: ignore[no-untyped-def]
    make = _Maker(1)
    written = {pid: make(n) for pid, n in enumerate(sizes)}

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *rec) for pid, rec in written.items()])
        pids = np.random.default_rng(len(sizes)).permutation(len(sizes)).astype(np.int64)
        seen = await _collect(store, pids, groups)
        for slot, pid in enumerate(pids.tolist()):
            ids, versions, vectors = written[pid]
            np.testing.assert_array_equal(seen[slot]["id"], ids)
            np.testing.assert_array_equal(seen[slot]["version"], versions)
            np.testing.assert_array_equal(seen[slot]["vector"], vectors)

    _run_store(tmp_path_factory.mktemp("reads"), body)


def test_a_corrupt_page_is_caught_with_or_without_the_caller_checking(tmp_path: Path) -> None:
    make = _Maker(2)

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *make(30)) for pid in range(6)])
        await store.sync()
        page = aligned_empty(PAGE_BYTES)
        at = np.array([int(store.start[4]) * PAGE_BYTES])
        await engine.read_batch(file, page, at, PAGE_BYTES)
        page[2 * REC + 30] ^= 0x01
        await engine.write_batch(file, page, at, PAGE_BYTES)
        pids = np.arange(6, dtype=np.int64)
        with pytest.raises(CorruptionError, match=r"posting list 4: record 2\b"):
            await _collect(store, pids, 3)
        read = store.begin_read(pids, 3)
        bad = []
        async with aclosing(read.groups(verified=False)) as groups:
            async for first, stop in groups:
                try:
                    read.verify(first, stop)
                except CorruptionError:
                    bad.append((first, stop))
        assert len(bad) == 1 and bad[0][0] <= 4 < bad[0][1]

    _run_store(tmp_path, body)


def test_pooled_reads_reuse_the_recycled_buffer(tmp_path: Path) -> None:
    make = _Maker(3)

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *make(50)) for pid in range(8)])
        first = store.begin_read(np.arange(8, dtype=np.int64), 2, allocate=store.take_buffer)
        async with aclosing(first.groups()) as groups:
            async for _ in groups:
                pass
        store.recycle(first.buffer)
        assert store.stats()["spare_buffer_bytes"] == len(first.buffer)
        smaller = store.begin_read(np.arange(3, dtype=np.int64), 2, allocate=store.take_buffer)
        assert smaller.buffer is first.buffer  # taken: the next pooled read allocates
        assert store.stats()["spare_buffer_bytes"] == 0
        other = store.begin_read(np.arange(3, dtype=np.int64), 1, allocate=store.take_buffer)
        assert other.buffer is not first.buffer
        async with aclosing(smaller.groups()) as groups:
            async for a, b in groups:
                for pid, records in zip(range(a, b), smaller.views(a, b), strict=True):
                    assert records["id"].tolist() == store_ids[pid]
        async with aclosing(other.groups()) as groups:
            async for _ in groups:
                pass
        store.recycle(aligned_empty(SPARE_LIMIT_BYTES + PAGE_BYTES))  # too big to keep
        assert store.stats()["spare_buffer_bytes"] == 0

    store_ids: dict[int, list[int]] = {
        pid: list(range(pid * 50, pid * 50 + 50)) for pid in range(8)
    }
    _run_store(tmp_path, body)


def test_two_spares_are_kept_the_larger_ones(tmp_path: Path) -> None:
    make = _Maker(4)

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *make(50)) for pid in range(8)])
        tiny = aligned_empty(2 * PAGE_BYTES)
        store.recycle(tiny)
        read = store.begin_read(np.arange(8, dtype=np.int64), 2, allocate=store.take_buffer)
        assert read.buffer is not tiny and len(read.buffer) > len(tiny)
        assert store.stats()["spare_buffer_bytes"] == len(tiny)  # not thrown away
        async with aclosing(read.groups()) as groups:
            async for _ in groups:
                pass
        store.recycle(read.buffer)
        assert store.stats()["spare_buffer_bytes"] == len(tiny) + len(read.buffer)
        assert store.take_buffer(PAGE_BYTES) is tiny  # the smallest that fits
        store.recycle(tiny)
        bigger = aligned_empty(len(read.buffer) + PAGE_BYTES)
        store.recycle(bigger)  # a third spare: the smallest goes
        assert store.stats()["spare_buffer_bytes"] == len(read.buffer) + len(bigger)

    _run_store(tmp_path, body)


def _byte_map(file_offsets: np.ndarray, lengths: np.ndarray, buffer_offsets: np.ndarray) -> dict:
    """Which file byte each buffer byte comes from (the model a merge must keep)."""
    out: dict[int, int] = {}
    for f, n, b in zip(
        file_offsets.tolist(), lengths.tolist(), buffer_offsets.tolist(), strict=True
    ):
        for i in range(0, n, PAGE_BYTES):  # page granularity is enough: requests are in pages
            out[b + i] = f + i
    return out


@settings(max_examples=60, deadline=None)
@given(
    pages=st.lists(st.integers(1, 1200), min_size=0, max_size=30),
    jumps=st.lists(st.booleans(), min_size=30, max_size=30),
)
def test_coalesce_keeps_every_byte_where_it_was_going(pages: list[int], jumps: list[bool]) -> None:
    """Requests packed back to back in the buffer; in the file some follow the previous one
    and some jump: merged requests move the same bytes to the same places, none follows its
    predecessor in both places any more, and none grows past the cap by more than one list."""
    lengths = np.array(pages, np.int64) * PAGE_BYTES
    buffer_offsets = np.cumsum(lengths) - lengths
    file_offsets = buffer_offsets + np.cumsum(np.array(jumps[: len(pages)], np.int64)) * (7 << 30)
    merged = coalesce(file_offsets, lengths, buffer_offsets)
    assert _byte_map(*merged) == _byte_map(file_offsets, lengths, buffer_offsets)
    f, n, b = merged
    assert n.sum() == lengths.sum()
    follows = (f[1:] == f[:-1] + n[:-1]) & (b[1:] == b[:-1] + n[:-1])
    assert not (follows & (n[:-1] + n[1:] <= MAX_REQUEST_BYTES)).any(), "a merge was missed"
    assert (n <= MAX_REQUEST_BYTES + lengths.max(initial=0)).all()


def test_lists_back_to_back_are_read_by_one_request(tmp_path: Path) -> None:
    """Lists written in one call lie back to back: read in file order they take one request
    per run (a gap, where a list moved away, starts a new one); read in another order they
    take one each. The records are right either way."""
    make = _Maker(5)
    written = {pid: make(n) for pid, n in enumerate([30, 5, 0, 60, 23, 24, 7, 40])}

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *rec) for pid, rec in written.items()])
        more = make(100)
        await store.append([PostingItem(4, *more)])  # list 4 moves to the file's end
        written[4] = tuple(np.concatenate([a, b]) for a, b in zip(written[4], more, strict=True))
        in_file_order = np.array([0, 1, 2, 3, 5, 6, 7, 4], np.int64)
        before = store.counters["read_requests"]
        seen = await _collect(store, in_file_order, 1)
        assert store.counters["read_requests"] - before == 3  # 0-3, 5-7, 4
        shuffled = np.array([7, 0, 5, 3, 1], np.int64)
        before = store.counters["read_requests"]
        seen_shuffled = await _collect(store, shuffled, 2)
        assert store.counters["read_requests"] - before == 5
        for pids, got in ((in_file_order, seen), (shuffled, seen_shuffled)):
            for slot, pid in enumerate(pids.tolist()):
                np.testing.assert_array_equal(got[slot]["id"], written[pid][0])
                np.testing.assert_array_equal(got[slot]["vector"], written[pid][2])

    _run_store(tmp_path, body)


@settings(max_examples=60, deadline=None)
@given(
    lists=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 6)), min_size=0, max_size=25),
    bridge=st.integers(0, 8),
)
def test_bridged_layout_reads_short_gaps_only(lists: list[tuple[int, int]], bridge: int) -> None:
    """Against a plain model: lists (pages, then a hole of some pages before the next list)
    in file order; a gap is read exactly when both neighbours are non-empty and the hole is
    at most ``bridge`` pages; lists land back to back apart from the gaps read."""
    pages = np.array([p for p, _ in lists], np.int64)
    holes = np.array([h for _, h in lists], np.int64)
    file_pages = np.cumsum(pages + holes) - pages - holes
    gap, first, total = bridged_layout(file_pages, pages, bridge)
    cursor = 0
    for i, (n, _) in enumerate(lists):
        hole = int(holes[i - 1]) if i else 0
        want = hole if i and 0 < hole <= bridge and n > 0 and pages[i - 1] > 0 else 0
        assert gap[i] == want
        assert first[i] == cursor + want
        cursor += want + n
    assert total == cursor


def test_a_read_runs_through_a_short_gap(tmp_path: Path) -> None:
    """Lists 0 and 2 with list 1 between them: bridged, one request (list 1's pages read and
    ignored); not bridged, two. The records are the same."""
    make = _Maker(6)
    written = {pid: make(n) for pid, n in enumerate([30, 40, 25, 5])}

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *rec) for pid, rec in written.items()])
        pids = np.array([0, 2, 3], np.int64)
        gap_pages = int(store.pages_of(np.array([1]))[0])
        for bridge, want_requests in ((gap_pages, 1), (gap_pages - 1, 2)):
            before = dict(store.counters)
            read = store.begin_read(pids, 1, bridge_pages=bridge)
            async with aclosing(read.groups()) as groups:
                async for first, stop in groups:
                    for pid, records in zip(pids[first:stop], read.views(first, stop), strict=True):
                        np.testing.assert_array_equal(records["id"], written[int(pid)][0])
                        np.testing.assert_array_equal(records["vector"], written[int(pid)][2])
            assert store.counters["read_requests"] - before["read_requests"] == want_requests
            extra = gap_pages if want_requests == 1 else 0
            assert store.counters["pages_read"] - before["pages_read"] == (
                int(store.pages_of(pids).sum()) + extra
            )
            assert store.read_pages(pids, bridge) == int(store.pages_of(pids).sum()) + extra
        # a damaged list in the gap is read but never checked: it is not what was asked for
        page = aligned_empty(PAGE_BYTES)
        at = np.array([int(store.start[1]) * PAGE_BYTES])
        await engine.read_batch(file, page, at, PAGE_BYTES)
        page[100] ^= 0x01
        await engine.write_batch(file, page, at, PAGE_BYTES)
        read = store.begin_read(pids, 1, bridge_pages=gap_pages)
        async with aclosing(read.groups()) as groups:
            async for _ in groups:
                pass
        with pytest.raises(CorruptionError):
            await store.read(np.array([1]))

    _run_store(tmp_path, body)
