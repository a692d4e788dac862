"""A corrupt posting list: searches answer without it and say so; verify() finds it; repair()
rebuilds it from replicas and reports what it could not recover.

The corruption is real: bytes flipped in ``postings.dat`` while the index is closed, then the
index reopened (its reads are O_DIRECT, so they see the disk).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from tiers.io.errors import CorruptionError
from vectordb import IndexConfig, SearchParams, SpannIndex
from vectordb.posting_format import PAGE_BYTES

from .helpers import clustered

DIM = 16
N = 3000
VECTOR_AT = 24  # a record's vector starts after id, version, reserved, check (posting_format)
ID_AT = 0


async def _build(directory: Path) -> np.ndarray:
    vectors = clustered(N, DIM, seed=3)
    config = IndexConfig(dim=DIM, posting_limit=64)
    async with await SpannIndex.create(directory, config) as index:
        await index.build(None, vectors)
    return vectors


async def _lists(index: SpannIndex) -> dict[int, np.ndarray]:
    """Every list's records, read (and verified) through the store."""
    pids = np.flatnonzero((index.store.capacity > 0) & (index.store.count > 0))
    batch = await index.store.read(pids)
    return {
        int(pid): batch.records[batch.starts[i] : batch.starts[i + 1]].copy()
        for i, pid in enumerate(pids)
    }


def _pick(lists: dict[int, np.ndarray], replicated: bool) -> tuple[int, int, int]:
    """(list, record number, id) of a record whose id has (or has not) a copy in another
    list."""
    copies: dict[int, int] = {}
    for records in lists.values():
        for vid in records["id"].tolist():
            copies[vid] = copies.get(vid, 0) + 1
    for pid, records in sorted(lists.items()):
        for number, vid in enumerate(records["id"].tolist()):
            if (copies[vid] > 1) == replicated and number > 0:
                return pid, number, vid
    raise AssertionError("no such record in this index")


def _flip(directory: Path, index_start_page: int, number: int, rec_bytes: int, at: int) -> None:
    offset = index_start_page * PAGE_BYTES + number * rec_bytes + at
    with open(directory / "postings.dat", "r+b") as file:
        file.seek(offset)
        byte = file.read(1)[0]
        file.seek(offset)
        file.write(bytes([byte ^ 0x40]))


async def _corrupt(directory: Path, replicated: bool, at: int) -> tuple[int, int, int]:
    async with await SpannIndex.open(directory) as index:
        pid, number, vid = _pick(await _lists(index), replicated)
        start, rec_bytes = int(index.store.start[pid]), index.store.rec_bytes
    _flip(directory, start, number, rec_bytes, at)
    return pid, number, vid


def test_a_search_answers_without_a_corrupt_list_and_says_so(tmp_path: Path) -> None:
    async def body() -> None:
        vectors = await _build(tmp_path / "i")
        queries = vectors[::15][:200] + 0.01
        async with await SpannIndex.open(tmp_path / "i") as index:
            before = await index.search(queries, 10)
        assert not before.degraded
        pid, _, _ = await _corrupt(tmp_path / "i", replicated=True, at=VECTOR_AT + 4)
        async with await SpannIndex.open(tmp_path / "i") as index:
            after = await index.search(queries, 10)  # 200 queries: the early-read path too
            alone = [await index.search(q, 10) for q in queries[:40]]  # one at a time
            with pytest.raises(CorruptionError, match=rf"posting list {pid}\b"):
                await index.search(queries, 10, SearchParams(strict=True))
            stats = index.stats()
        assert after.degraded and after.skipped_lists.tolist() == [pid]
        assert any(result.degraded for result in alone)
        assert stats["corrupt_lists_skipped"] >= 1 + sum(r.degraded for r in alone)
        ids, scores = after  # still unpacks as a pair
        # every answer is a real vector at its true distance; most answers are unchanged
        found = ids >= 0
        true = ((vectors[ids[found]] - np.repeat(queries, 10, 0)[found.ravel()]) ** 2).sum(1)
        np.testing.assert_allclose(scores[found], true, rtol=1e-4, atol=1e-3)
        same = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, before.ids, strict=True)])
        assert same > 0.9

    asyncio.run(body())


def test_verify_finds_the_bad_record_and_repair_restores_it_from_a_replica(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        vectors = await _build(tmp_path / "i")
        queries = vectors[::30] + 0.01
        async with await SpannIndex.open(tmp_path / "i") as index:
            assert (await index.verify()).ok
            before = await index.search(queries, 10)
        pid, number, _ = await _corrupt(tmp_path / "i", replicated=True, at=VECTOR_AT)
        async with await SpannIndex.open(tmp_path / "i") as index:
            scrub = await index.verify()
            assert scrub.bad_records == {pid: [number]}
            assert scrub.lists_checked == int((index.store.count > 0).sum())
            assert scrub.records_checked == int(index.store.count.sum())
            report = await index.repair()
            assert report.repaired_lists == [pid] and report.records_recovered == 1
            assert report.unrecovered == {} and report.complete
        async with await SpannIndex.open(tmp_path / "i") as index:  # the repair is durable
            assert (await index.verify()).ok
            after = await index.search(queries, 10)
        assert not after.degraded
        for a, b in zip(after.ids, before.ids, strict=True):
            assert set(a.tolist()) == set(b.tolist())
        np.testing.assert_allclose(np.sort(after.scores, 1), np.sort(before.scores, 1), rtol=1e-6)

    asyncio.run(body())


@pytest.mark.parametrize(
    ("replicated", "at", "lost"),
    [(False, VECTOR_AT, True), (True, ID_AT + 2, False)],
    ids=["only-copy", "unreadable-id"],
)
def test_repair_reports_what_it_could_not_recover(
    tmp_path: Path, replicated: bool, at: int, lost: bool
) -> None:
    async def body() -> None:
        await _build(tmp_path / "i")
        pid, number, vid = await _corrupt(tmp_path / "i", replicated, at)
        async with await SpannIndex.open(tmp_path / "i") as index:
            count = int(index.store.count[pid])
            report = await index.repair()
            assert report.repaired_lists == [pid]
            assert report.unrecovered == {pid: [number]}
            assert report.lost_ids.tolist() == ([vid] if lost else [])
            assert report.complete is not lost
            assert int(index.store.count[pid]) == count - 1
            assert (await index.verify()).ok

    asyncio.run(body())


def test_a_clean_index_verifies_and_repairs_to_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        await _build(tmp_path / "i")
        async with await SpannIndex.open(tmp_path / "i") as index:
            scrub = await index.verify()
            assert scrub.ok and scrub.records_checked >= N
            report = await index.repair()
            assert report.repaired_lists == [] and report.complete

    asyncio.run(body())
