"""Scrub and repair: read every posting list, find the records that fail their check, and
rebuild the lists that hold them from their members' replicas.

A search that meets a corrupt list answers without it (search.py); these two calls are how an
operator finds all of them and puts them right:

- :func:`verify` reads every list once, in file order, ``_PIECE_BYTES`` at a time into one
  reused buffer, and checks every record (posting_format.bad_records): a ScrubReport.
- :func:`repair` scrubs the same way, then reads everything a second time to find, for each bad
  record whose (id, version) the version map still calls live, a verified copy of that vector
  in another list. Each corrupt list is rewritten (copy-on-write, posting_store.write) with its
  records that verify (stale copies dropped) plus the recovered ones, and a checkpoint makes it
  durable. A bad record whose id is unreadable or has no verified copy is dropped and reported;
  live ids left with no verified copy anywhere are reported as lost.

Concurrency: both hold ``index.update_lock`` while they read (no update or checkpoint moves a
list under them); searches go on meanwhile. repair checkpoints after releasing it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import aclosing
from typing import TYPE_CHECKING

import numpy as np

from tiers.io import aligned_empty
from vectordb.batch_reads import in_file_order
from vectordb.build import posting_capacity
from vectordb.posting_format import PAGE_BYTES, bad_records
from vectordb.posting_store import PostingItem
from vectordb.scrub_report import RepairReport, ScrubReport
from vectordb.version_map import DELETED

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["repair", "verify"]

_PIECE_BYTES = 32 << 20  # read at a time; one buffer this size is reused for the whole scan
# visit(pids, records of each list, bad-record mask of each list)
_Visit = Callable[[np.ndarray, list[np.ndarray], list[np.ndarray]], None]


async def verify(index: SpannIndex) -> ScrubReport:
    report = ScrubReport()
    async with index.update_lock:
        await _scan(index, report, _note_bad(report))
    return report


async def repair(index: SpannIndex) -> RepairReport:
    scrub = ScrubReport()
    broken: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # pid: (records copy, bad mask)
    seen: list[np.ndarray] = []  # ids of verified, current records anywhere

    def keep(pids: np.ndarray, lists: list[np.ndarray], bad: list[np.ndarray]) -> None:
        _note_bad(scrub)(pids, lists, bad)
        for pid, records, mask in zip(pids.tolist(), lists, bad, strict=True):
            if mask.any():
                broken[pid] = (records.copy(), mask)
            good = records[~mask]
            seen.append(good["id"][index.versions.valid(good["id"], good["version"])])

    async with index.update_lock:
        await _scan(index, scrub, keep)
        report = RepairReport(scrub)
        if broken:
            copies = await _find_copies(index, broken)
            items = [_rebuilt(index, pid, *broken[pid], copies, report) for pid in sorted(broken)]
            await index.store.write(items)
            report.repaired_lists = sorted(broken)
            seen.extend(item.ids for item in items)
        report.lost_ids = _lost(index, np.concatenate([np.zeros(0, np.int64), *seen]))
    if broken:
        await index.checkpoint()
        index.corrupt_lists.difference_update(broken)
    return report


def _note_bad(report: ScrubReport) -> _Visit:
    def visit(pids: np.ndarray, lists: list[np.ndarray], bad: list[np.ndarray]) -> None:
        for pid, mask in zip(pids.tolist(), bad, strict=True):
            if mask.any():
                report.bad_records[pid] = np.flatnonzero(mask).tolist()

    return visit


async def _scan(index: SpannIndex, report: ScrubReport, visit: _Visit) -> None:
    """Read every list once, ``_PIECE_BYTES`` at a time, and hand each piece to ``visit``
    (its record views are valid only during the call)."""
    store = index.store
    pids = in_file_order(store, np.flatnonzero((store.capacity > 0) & (store.count > 0)))
    buffer = aligned_empty(_PIECE_BYTES + PAGE_BYTES)

    def allocate(size_bytes: int) -> np.ndarray:  # a list longer than a piece: its own
        return buffer[:size_bytes] if size_bytes <= len(buffer) else aligned_empty(size_bytes)

    for piece in _pieces(store.pages_of(pids), pids):
        need = int(store.pages_of(piece).sum() + 1) * PAGE_BYTES
        read = store.begin_read(piece, allocate=allocate)
        async with aclosing(read.groups(verified=False)) as groups:
            async for _ in groups:
                pass
        mask = bad_records(read.buffer, read.byte_offsets, read.counts, store.dtype, read.pids)
        bounds = np.concatenate([[0], np.cumsum(read.counts)])
        bad = [mask[a:b] for a, b in itertools.pairwise(bounds)]
        visit(read.pids, read.views(0, len(piece)), bad)
        report.lists_checked += len(piece)
        report.records_checked += int(read.counts.sum())
        report.bytes_read += need - PAGE_BYTES


def _pieces(pages: np.ndarray, pids: np.ndarray) -> Iterator[np.ndarray]:
    """``pids`` cut into runs of at most ``_PIECE_BYTES`` of pages (a longer list alone)."""
    budget = _PIECE_BYTES // PAGE_BYTES
    first, used = 0, 0
    for i, n in enumerate(pages.tolist()):
        if used and used + n > budget:
            yield pids[first:i]
            first, used = i, 0
        used += n
    if first < len(pids):
        yield pids[first:]


async def _find_copies(
    index: SpannIndex, broken: dict[int, tuple[np.ndarray, np.ndarray]]
) -> dict[int, np.ndarray]:
    """For each bad record that names a live (id, version), one verified record of that id
    and version from any list: {id: record}."""
    wanted = np.unique(np.concatenate([records["id"][mask] for records, mask in broken.values()]))
    copies: dict[int, np.ndarray] = {}

    def take(pids: np.ndarray, lists: list[np.ndarray], bad: list[np.ndarray]) -> None:
        for records, mask in zip(lists, bad, strict=True):
            good = records[~mask]
            hit = np.isin(good["id"], wanted) & index.versions.valid(good["id"], good["version"])
            for record in good[hit]:
                copies.setdefault(int(record["id"]), record.copy())

    await _scan(index, ScrubReport(), take)
    return copies


def _rebuilt(
    index: SpannIndex,
    pid: int,
    records: np.ndarray,
    bad: np.ndarray,
    copies: dict[int, np.ndarray],
    report: RepairReport,
) -> PostingItem:
    good = records[~bad]
    good = good[index.versions.valid(good["id"], good["version"])]  # stale copies go too
    have = set(good["id"].tolist())
    restored, dropped = [], []
    for number in np.flatnonzero(bad).tolist():
        record = records[number]
        copy = copies.get(int(record["id"]))
        if copy is None or copy["version"] != record["version"] or int(record["id"]) in have:
            dropped.append(number)
            continue
        have.add(int(record["id"]))
        restored.append(copy)
    if dropped:
        report.unrecovered[pid] = dropped
    report.records_recovered += len(restored)
    rows = np.concatenate([good, np.array(restored, records.dtype)])
    capacity = posting_capacity(len(rows), index.config.posting_limit)
    ids, versions, vectors = rows["id"].copy(), rows["version"].copy(), rows["vector"].copy()
    return PostingItem(pid, ids, versions, vectors, capacity)


def _lost(index: SpannIndex, found_ids: np.ndarray) -> np.ndarray:
    """Live ids with no verified copy among ``found_ids``."""
    ids, versions = index.versions.snapshot()
    live = ids[(versions != 0) & ((versions & DELETED) == 0)]
    return np.setdiff1d(live, found_ids)
