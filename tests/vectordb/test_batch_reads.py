"""BatchReads (one batch's reads sharing one buffer) on a real file through a real engine, and
the search path that starts reads while the head scan runs: every list once, at the batch index
the read order gives it, records equal what was written; a search whose early reads stop at the
buffer's end, or fail on a corrupt page, still answers exactly (or raises) and leaves nothing
in flight."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import aclosing
from pathlib import Path

import numpy as np
import pytest

from tests.vectordb.helpers import clustered
from tests.vectordb.test_posting_store import _Maker, _run_store
from tiers.io.engine import FileHandle, IOEngine
from tiers.io.errors import CorruptionError
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.batch_reads import BatchReads
from vectordb.posting_format import PAGE_BYTES
from vectordb.posting_store import PostingItem, PostingStore


def test_reads_share_one_buffer_and_number_lists_in_start_order(tmp_path: Path) -> None:
    make = _Maker(5)
    written = {pid: make(n) for pid, n in enumerate([3, 0, 40, 17, 9, 25, 1])}

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *rec) for pid, rec in written.items()])
        reads = BatchReads(store, 64 * PAGE_BYTES)
        reads.start(np.array([2, 5]))
        reads.start_missing(np.array([0, 1, 2, 3, 5, 6]), n_groups=2)  # 2 and 5 not again
        np.testing.assert_array_equal(reads.pids, [2, 5, 0, 1, 3, 6])
        assert reads.longest == 40
        assert not reads.fits(np.arange(7)) or store.pages_of(np.arange(7)).sum() < 40
        seen: dict[int, np.ndarray] = {}
        async with aclosing(reads.groups()) as groups:
            async for read, batch_first, first, stop in groups:
                read.verify(first, stop)
                for i, records in enumerate(read.views(first, stop)):
                    assert batch_first + i not in seen
                    seen[batch_first + i] = records.copy()
        assert sorted(seen) == list(range(6))
        for index, pid in enumerate(reads.pids.tolist()):
            np.testing.assert_array_equal(seen[index]["id"], written[pid][0])
            np.testing.assert_array_equal(seen[index]["vector"], written[pid][2])
        buffers = {id(read.buffer.base) for read in reads.reads}
        assert len(buffers) == 1  # parts of one buffer
        reads.release()
        assert store.stats()["spare_buffer_bytes"] >= 64 * PAGE_BYTES

    _run_store(tmp_path, body)


def test_a_read_past_the_capacity_gets_its_own_buffer(tmp_path: Path) -> None:
    make = _Maker(6)

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *make(60)) for pid in range(4)])
        reads = BatchReads(store, 4 * PAGE_BYTES)
        assert not reads.fits(np.arange(4))
        reads.start(np.arange(4))  # too big: correct anyway
        async with aclosing(reads.groups()) as groups:
            async for read, _, first, stop in groups:
                read.verify(first, stop)
        reads.release()
        assert store.stats()["spare_buffer_bytes"] == 0  # a one-off buffer is not kept

    _run_store(tmp_path, body)


@pytest.mark.parametrize("budget_pages", [40, 110, 1 << 16])
def test_reading_while_navigating_answers_as_single_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget_pages: int
) -> None:
    """The early reads cover no query (40 pages), some (110) or every query of the front
    half; the answers equal one-query-at-a-time searches either way."""
    import vectordb.search as search_module

    covered: list[tuple[int, int]] = []
    navigate = search_module._navigate_reading

    async def spy(index, queries, *args):  # type: ignore[no-untyped-def]
        out = await navigate(index, queries, *args)
        covered.append((out[3], len(queries)))
        return out

    monkeypatch.setattr(search_module, "_navigate_reading", spy)
    monkeypatch.setattr(search_module, "READ_BUFFER_BYTES", budget_pages * PAGE_BYTES)
    monkeypatch.setattr(search_module, "READ_BUDGET_BYTES", budget_pages * PAGE_BYTES)
    vectors = clustered(3000, 16, seed=21)
    queries = clustered(200, 16, seed=22)

    async def main() -> None:
        # head_fraction pinned: the budgets above are sized to this build's lists
        config = IndexConfig(dim=16, metric="l2", posting_limit=48, head_fraction=0.12)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            # without shared lists a batch scores what single queries do (test_shared_postings)
            params = SearchParams(max_postings=6, shared_postings=0)
            whole = await index.search(queries, k=7, params=params)
            alone = [await index.search(q[None, :], k=7, params=params) for q in queries]
        np.testing.assert_array_equal(whole[0], np.concatenate([a[0] for a in alone]))
        np.testing.assert_allclose(whole[1], np.concatenate([a[1] for a in alone]), rtol=1e-5)

    asyncio.run(main())
    assert len(covered) == 1
    early, n = covered[0]
    if budget_pages == 40:
        assert early == 0
    elif budget_pages == 110:
        assert 0 < early < n // 2
    else:
        assert early == n // 2


def test_a_corrupt_page_in_an_early_read_leaves_nothing_in_flight(
    tmp_path: Path,
) -> None:
    vectors = clustered(2000, 16, seed=23)
    queries = clustered(160, 16, seed=24)

    async def main() -> None:
        config = IndexConfig(dim=16, posting_limit=48)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            await index.store.sync()
            pids, _ = index.navigator.search(queries[:1], 1)
            start = int(index.store.start[int(pids[0, 0])]) * PAGE_BYTES
            _flip_byte(index.data_files()[0], start + 100)  # the first query's nearest list
            strict = SearchParams(max_postings=4, strict=True)
            with pytest.raises(CorruptionError, match="posting list"):
                await index.search(queries, k=5, params=strict)
            assert not index.head_scans
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert not pending
            # by default the batch is answered without that list, and says so
            result = await index.search(queries, k=5, params=SearchParams(max_postings=4))
            assert result.skipped_lists.tolist() == [int(pids[0, 0])]
            assert not index.head_scans
            pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            assert not pending

    asyncio.run(main())


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x40]))


def test_heads_quiet_waits_for_a_running_head_scan() -> None:
    async def main() -> None:
        index = SpannIndex.__new__(SpannIndex)
        index.head_scans = set()
        scan: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        index.head_scans.add(scan)
        scan.add_done_callback(index.head_scans.discard)
        waiter = asyncio.ensure_future(index.heads_quiet())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        scan.set_result(None)
        await asyncio.wait_for(waiter, 1)

    asyncio.run(main())


def test_heads_stay_still_until_a_large_batch_is_navigated(tmp_path: Path) -> None:
    """A batch large enough to read while navigating yields between pieces of its head scan;
    an updater's heads_quiet must wait for the last piece, not only for the scoring thread's
    half (a split in between gave pieces of different widths: a ValueError in a search run
    beside inserts)."""
    vectors = clustered(3000, 16, seed=31)

    async def main() -> None:
        config = IndexConfig(dim=16, posting_limit=48)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            loop_thread = threading.get_ident()
            pieces: list[int] = []  # head scans on the loop thread, in order
            first_piece = asyncio.Event()
            scan = index.navigator.search

            def spy(queries: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
                if threading.get_ident() == loop_thread:
                    pieces.append(len(queries))
                    first_piece.set()
                    time.sleep(0.02)  # the scoring thread's half is done well before the last
                return scan(queries, want)

            index.navigator.search = spy  # type: ignore[method-assign]
            seen_when_quiet: list[int] = []

            async def updater() -> None:
                await first_piece.wait()
                await index.heads_quiet()
                seen_when_quiet.append(len(pieces))

            await asyncio.wrap_future(index.scorer.submit(int))  # its warm-up is done
            task = asyncio.create_task(updater())
            await index.search(vectors[:1024], 5, SearchParams(max_postings=4))
            await task
            assert len(pieces) > 1, "the batch was not navigated piece by piece"
            assert seen_when_quiet == [len(pieces)]

    asyncio.run(main())


def test_a_read_takes_its_lists_in_file_order(tmp_path: Path) -> None:
    """Lists are numbered in the batch by their place in the file, so lists back to back
    there share a request: a list that moved comes last and is read on its own."""
    make = _Maker(8)
    written = {pid: make(n) for pid, n in enumerate([30, 12, 44, 3, 23, 9])}

    async def body(engine: IOEngine, file: FileHandle, store: PostingStore) -> None:
        await store.write([PostingItem(pid, *rec) for pid, rec in written.items()])
        await store.append([PostingItem(1, *make(80))])  # moves to the end of the file
        bridged = BatchReads(store, 128 * PAGE_BYTES)  # runs through list 1's old run
        before = store.counters["read_requests"]
        bridged.start(np.array([5, 1, 0, 3, 2, 4]))
        assert store.counters["read_requests"] - before == 1
        await bridged.finish()
        reads = BatchReads(store, 128 * PAGE_BYTES, bridge_pages=0)
        before = store.counters["read_requests"]
        reads.start(np.array([5, 1, 0, 3, 2, 4]))
        np.testing.assert_array_equal(reads.pids, [0, 2, 3, 4, 5, 1])
        assert store.counters["read_requests"] - before == 2
        async with aclosing(reads.groups()) as groups:
            async for read, batch_first, first, stop in groups:
                read.verify(first, stop)
                for i, records in enumerate(read.views(first, stop)):
                    pid = int(reads.pids[batch_first + i])
                    want = written[pid][0]
                    np.testing.assert_array_equal(records["id"][: len(want)], want)
        reads.release()

    _run_store(tmp_path, body)


@pytest.mark.parametrize("corrupt", [False, True])
def test_chunks_overlap_two_at_a_time(tmp_path: Path, monkeypatch, corrupt: bool) -> None:  # type: ignore[no-untyped-def]
    """A batch cut into many chunks runs two at once (the next one's reads start once the
    previous one's have landed), never more, and answers as single queries do; a corrupt page
    in any chunk is an error that leaves nothing in flight."""
    import vectordb.search as search_module
    import vectordb.search_chunk as chunk_module

    running, most = [0], [0]
    chunk = search_module.search_chunk

    async def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            return await chunk(*args, **kwargs)
        finally:
            running[0] -= 1

    score_group = chunk_module.score_group

    def slow_score_group(*args):  # type: ignore[no-untyped-def]
        time.sleep(0.01)  # scoring outlasts the loop's step to the next chunk: they must overlap
        score_group(*args)

    monkeypatch.setattr(search_module, "search_chunk", spy)
    monkeypatch.setattr(chunk_module, "score_group", slow_score_group)
    monkeypatch.setattr(search_module, "READ_BUDGET_BYTES", 12 * PAGE_BYTES)  # ~2 queries
    vectors = clustered(3000, 16, seed=25)
    queries = clustered(90, 16, seed=26)

    async def main() -> None:
        config = IndexConfig(dim=16, posting_limit=48)
        params = SearchParams(max_postings=5, shared_postings=0)  # answers as single queries
        strict = SearchParams(max_postings=5, shared_postings=0, strict=True)
        async with await SpannIndex.create(tmp_path / "i", config) as index:
            await index.build(None, vectors)
            await index.store.sync()
            if corrupt:
                pids, _ = index.navigator.search(queries[-1:], 1)
                start = int(index.store.start[int(pids[0, 0])]) * PAGE_BYTES
                _flip_byte(index.data_files()[0], start + 100)
                with pytest.raises(CorruptionError, match="posting list"):
                    await index.search(queries, k=5, params=strict)
                pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                assert not pending
                return
            whole = await index.search(queries, k=5, params=params)
            assert most[0] == 2
            monkeypatch.setattr(chunk_module, "score_group", score_group)
            alone = [await index.search(q[None, :], k=5, params=params) for q in queries]
        np.testing.assert_array_equal(whole[0], np.concatenate([a[0] for a in alone]))
        np.testing.assert_allclose(whole[1], np.concatenate([a[1] for a in alone]), rtol=1e-5)

    asyncio.run(main())
    assert most[0] <= 2
