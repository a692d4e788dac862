"""One chunk of a search batch: read its lists (taking over reads already started), check
and score them group by group, and take each query's best ``k`` (search.py cuts a batch into
chunks and runs two at once).

Scoring runs on the index's scoring thread (``index.scorer``) while the loop thread submits and
reaps the rest of the chunk's reads, unless the chunk is small (``inline``: one read group,
scored on the loop thread, where a thread hop costs more than the scoring). Lists read from the
device are offered to the list cache once scoring has checked them. Lists that fail their
check are named in the answer and logged once; lists seen with few live vectors are noted for
merging (done by the next update).

Thread-safety: the loop thread, but for ``score_group`` (the scoring thread, one at a time).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing
from typing import TYPE_CHECKING

import numpy as np

from vectordb.batch_reads import BatchReads, buffer_bytes, in_file_order
from vectordb.config import SearchParams
from vectordb.posting_format import PAGE_BYTES
from vectordb.posting_reads import PostingRead
from vectordb.scoring import Access, ProbeScores

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["ChunkAnswer", "note_corrupt_lists", "score_group", "search_chunk"]

log = logging.getLogger("tierkit.vectordb")
ChunkAnswer = tuple[np.ndarray, np.ndarray, np.ndarray]  # ids, distances, corrupt lists
READ_GROUPS = 4  # lists are scored a group at a time while the other groups are read


async def search_chunk(
    index: SpannIndex,
    queries: np.ndarray,
    pids: np.ndarray,
    keep: np.ndarray,
    shared: np.ndarray,
    k: int,
    params: SearchParams,
    reads: BatchReads | None = None,
    landed: asyncio.Event | None = None,
    inline: bool = False,
    access: Access | None = None,
) -> ChunkAnswer:
    """Score one chunk of queries: each its ``keep`` lists, and its ``shared`` ones that the
    chunk reads for other queries. ``reads``: reads already started for some of its lists
    (taken over: the rest of the lists are added to them), else a new set. ``landed`` is set
    once every read of the chunk has landed (or the chunk failed). ``inline``: a small
    chunk, read in one group and scored on the loop thread (a hop to the scoring thread
    costs more than its scoring). Returns (ids, internal distances, the lists skipped as
    corrupt)."""
    unique = np.unique(pids[keep])
    if shared.any():
        keep = keep | (shared & np.isin(pids, unique))
    probe_query, probe_slot = np.nonzero(keep)
    probe_pid = pids[probe_query, probe_slot]
    n_groups = 1 if inline else READ_GROUPS
    lone = inline and len(queries) == 1  # a user's one query: one read, whatever its size
    rounds, reads = _read_rounds(index, unique, reads, n_groups, lone)
    loop = asyncio.get_running_loop()
    scoring: list[asyncio.Future[None]] = []
    offset = 0  # batch index of the round's first list
    try:
        if rounds is None:  # every list in one buffer, read at once
            reads.start_missing(unique, n_groups)
            order = reads.pids  # the batch's list order: list_of indexes it
        else:  # rounds, each within the budget's read buffer: the early reads, then the rest
            order = np.concatenate([reads.pids, *rounds])
        sorter = np.argsort(order)
        list_of = sorter[np.searchsorted(order, probe_pid, sorter=sorter)]
        by_list = np.argsort(list_of, kind="stable")
        probe_query, probe_slot = probe_query[by_list], probe_slot[by_list]
        list_of = list_of[by_list]
        bounds = np.searchsorted(list_of, np.arange(len(order) + 1))
        # the reads' own snapshot of the counts (a list may grow or be rewritten meanwhile)
        longest = reads.longest
        scores = ProbeScores(index.metric, queries, probe_query, list_of, bounds, longest)
        for number in range(1 + len(rounds or [])):
            if number:  # the last round's buffer is free: the next one reuses it
                reads = BatchReads(index.store, index.memory.read_buffer_bytes or 0)
                reads.start(rounds[number - 1], n_groups)  # type: ignore[index]
                scores.widen(reads.longest)  # appended to since the first round: room
            async with aclosing(reads.groups()) as groups:
                async for read, batch_first, first, stop in groups:
                    lists = read.views(first, stop)
                    ids_live = ProbeScores.live_mask(lists, index.versions)
                    job = (read, scores, offset + batch_first, first, lists, ids_live, params)
                    if inline:
                        score_group(*job)
                    else:
                        scoring.append(loop.run_in_executor(index.scorer, score_group, *job))
            if rounds is not None:  # scored, offered and freed before the next round
                await _round_done(index, reads, scores, scoring, offset)
                offset += len(reads.pids)
                scoring = []
        if landed is not None:
            landed.set()
        outcomes = await asyncio.gather(*scoring, return_exceptions=True)
    except BaseException:
        await asyncio.gather(*scoring, return_exceptions=True)
        await reads.finish()
        raise
    finally:
        if landed is not None:
            landed.set()
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    corrupt_rows = np.asarray(scores.corrupt, np.int64)
    if rounds is None:
        if index.store.cache is not None:  # lists read (and checked by scoring) may be kept
            await reads.offer_to(index.store.cache, corrupt_rows)
        reads.release()  # every read and every view of it is done with
    corrupt = order[corrupt_rows]
    live = scores.live_counts
    live[scores.corrupt] = index.config.merge_threshold + 1  # not small: unreadable
    note_small_lists(index, order, live)
    ids, dist = scores.best(probe_query, probe_slot, queries, pids.shape[1], k, access)
    return ids, dist, corrupt


def _read_rounds(
    index: SpannIndex, unique: np.ndarray, reads: BatchReads | None, n_groups: int, lone: bool
) -> tuple[list[np.ndarray] | None, BatchReads]:
    """(None, the reads to add every list to) where a chunk's lists are read into one buffer;
    under a memory budget whose read buffer they do not fit (a few queries' lists at a
    large ``max_postings``: at 43 lists on debian-minilm one query reads ~2 MB, the tight
    budget's buffer is 1 MiB), (rounds, the first round's reads): the reads started already,
    then the other lists in file order, cut into rounds each within the read buffer (a list
    larger than it is a round of its own), read and scored one after another in one reused
    buffer. A lone query (``lone``) keeps its one read: what a round adds is its latency."""
    store, limit = index.store, index.memory.read_buffer_bytes
    started = reads.pids if reads is not None else np.zeros(0, np.int64)
    if limit is None or lone or buffer_bytes(store, unique, bridge_pages=0) <= limit:
        return None, reads or BatchReads(store, _buffer_bytes(index, unique))
    missing = in_file_order(store, np.setdiff1d(unique, started, assume_unique=True))
    pages = store.pages_of(missing) if len(missing) else np.zeros(0, np.int64)
    room = max(1, limit // PAGE_BYTES - 1)  # PostingRead's spare page
    rounds: list[np.ndarray] = []
    first = 0
    while first < len(missing):
        fits = int(np.searchsorted(np.cumsum(pages[first:]), room, side="right"))
        stop = first + max(1, fits)
        rounds.append(missing[first:stop])
        first = stop
    if reads is None:  # the first round is the first piece
        reads = BatchReads(store, limit)
        if rounds:
            reads.start(rounds.pop(0), n_groups)
    return rounds, reads


async def _round_done(
    index: SpannIndex,
    reads: BatchReads,
    scores: ProbeScores,
    scoring: list[asyncio.Future[None]],
    offset: int,
) -> None:
    """Wait for a round's scoring, offer its checked lists to the cache, free its buffer."""
    outcomes = await asyncio.gather(*scoring, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            await reads.finish()
            raise outcome
    if index.store.cache is not None:
        corrupt = np.asarray(scores.corrupt, np.int64) - offset
        await reads.offer_to(index.store.cache, corrupt[corrupt >= 0])
    reads.release()


def _buffer_bytes(index: SpannIndex, pids: np.ndarray) -> int:
    """A chunk's read buffer: its lists and the gaps read through between them, but under a
    memory budget no more than the budget's read buffer where the lists alone fit it (the
    gaps are then skipped: more requests, no more memory)."""
    bridged = buffer_bytes(index.store, pids)
    limit = index.memory.read_buffer_bytes
    if limit is None or bridged <= limit:
        return bridged
    return max(buffer_bytes(index.store, pids, bridge_pages=0), limit)


def score_group(
    read: PostingRead,
    scores: ProbeScores,
    batch_first: int,
    first: int,
    lists: list[np.ndarray],
    ids_live: tuple[np.ndarray, np.ndarray],
    params: SearchParams,
) -> None:
    """On the scoring thread: check and score the group's records (lists ``first``... of
    ``read``, lists ``batch_first``... of the batch) in one pass (dot_kernel)."""
    stop = first + len(lists)
    spans = read.spans(first, stop)
    counts = read.counts[first:stop]
    scores.add(batch_first, counts, ids_live, spans, skip_corrupt=not params.strict)


def note_corrupt_lists(index: SpannIndex, pids: np.ndarray) -> None:
    """Count the skipped lists; log each the first time it is met."""
    index.counters["corrupt_lists_skipped"] += len(pids)
    new = sorted(set(pids.tolist()) - index.corrupt_lists)
    if new:
        index.corrupt_lists.update(new)
        log.warning(
            "vectordb %s: posting lists %s fail their check; searches answer without them "
            "(SpannIndex.repair() rebuilds them from replicas)",
            index.directory,
            new[:20],
        )


def note_small_lists(index: SpannIndex, pids: np.ndarray, live: np.ndarray) -> None:
    if len(pids) == 0 or index.config.merge_threshold == 0 or index.navigator.n_heads <= 1:
        return
    small = pids[live <= index.config.merge_threshold]
    if len(small):
        index.merge_candidates.update(small.tolist())
