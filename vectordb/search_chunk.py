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

from vectordb.batch_reads import BatchReads, buffer_bytes
from vectordb.config import SearchParams
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
    if reads is None:
        reads = BatchReads(index.store, _buffer_bytes(index, unique))
    loop = asyncio.get_running_loop()
    scoring: list[asyncio.Future[None]] = []
    try:
        reads.start_missing(unique, 1 if inline else READ_GROUPS)
        order = reads.pids  # the batch's list order: list_of indexes it
        sorter = np.argsort(order)
        list_of = sorter[np.searchsorted(order, probe_pid, sorter=sorter)]
        by_list = np.argsort(list_of, kind="stable")
        probe_query, probe_slot = probe_query[by_list], probe_slot[by_list]
        list_of = list_of[by_list]
        bounds = np.searchsorted(list_of, np.arange(len(order) + 1))
        scores = ProbeScores(index.metric, queries, probe_query, list_of, bounds, reads.longest)
        async with aclosing(reads.groups()) as groups:
            async for read, batch_first, first, stop in groups:
                lists = read.views(first, stop)
                ids_live = ProbeScores.live_mask(lists, index.versions)
                job = (read, scores, batch_first, first, lists, ids_live, params)
                if inline:
                    score_group(*job)
                else:
                    scoring.append(loop.run_in_executor(index.scorer, score_group, *job))
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
    if index.store.cache is not None:  # lists read (and checked by scoring) may be kept
        await reads.offer_to(index.store.cache, corrupt_rows)
    reads.release()  # every read and every view of it is done with
    corrupt = order[corrupt_rows]
    live = scores.live_counts
    live[scores.corrupt] = index.config.merge_threshold + 1  # not small: unreadable
    note_small_lists(index, order, live)
    ids, dist = scores.best(probe_query, probe_slot, queries, pids.shape[1], k, access)
    return ids, dist, corrupt


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
