"""Search: navigate the heads, prune, read every needed list of the batch at once, rerank.

For a batch of queries:

1. the navigator gives each query its ``max_postings`` nearest heads (when not set, the
   index's default: measured on its own vectors, probe_rule.py; a large batch split over
   the loop and scoring threads; numpy's BLAS held to one thread meanwhile: tiers.io.cpu_threads);
2. a head farther than ``prune_ratio`` x the nearest head's distance (squared L2; for cosine
   computed from the similarity; not applied to raw inner product) is skipped;
3. the union of the lists over the whole batch is read once (a list two queries need is read
   once; lists back to back in the file, or a short gap apart, share one request:
   posting_reads); the lists arrive in a few groups, each checked and scored on the index's
   scoring thread while the loop thread submits and reaps the rest. From
   ``_READ_WHILE_NAVIGATING_AT`` queries the reads start during step 1: each piece of the loop
   thread's share of the head scan starts the reads of its new lists, so the device works
   while the heads are still being scanned; the rest of the lists follow in one submission
   (batch_reads.BatchReads: all of them in one buffer);
   Shared lists: the navigator also gives each query its next ``shared_postings`` heads
   (default: as many again); of those, the lists the batch (chunk) reads anyway for other
   queries are scored for it too. They cost no I/O, only scoring, and a batch's answers can
   only improve (each query scores a superset of what it would alone; a single query is
   unchanged). Measured (benchmarks/RESULTS.md, git 486506f): recall 0.9 at 62% (fashion-mnist)
   and 74% (debian-minilm) of the bytes read without them;
4. per group, one compiled pass checks every record's check word and takes the exact dot
   products with the queries that probe its list (dot_kernel, no GIL held); then, vectorised
   over the batch, stale copies (older version) and deleted ids masked out, and per query the
   best ``k`` distinct ids (replicas counted once): scoring.ProbeScores.

Steps 3 and 4 for one chunk of queries are search_chunk.py. A large batch is cut into chunks
of queries, so that one chunk's lists fit a reusable read buffer and its distance matrix stays
within ``_CELL_BUDGET`` (under a memory budget, both scale with its read buffer); the queries
are taken in the order of their nearest head (chunk_plan.locality_order), so a chunk holds
queries near each other, which share lists; two chunks overlap (one at a time under a tight
memory budget: memory_budget.py) (the next one's reads start once
the previous one's have landed, so the device does not idle through a chunk's last scoring and
top-k). Small searches (up to ``SMALL_BATCH_QUERIES``) from concurrent callers are gathered
into shared batches first (gather.py).

Lists seen with few live vectors are noted for merging (done by the next update).
Concurrency: runs beside other searches and one updater (see posting_store for why reads
stay consistent); registers itself in ``index.searches`` so a checkpoint can wait for it.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from tiers.io import single_threaded_blas
from vectordb.batch_reads import BatchReads
from vectordb.chunk_plan import locality_order, query_chunks
from vectordb.config import SearchParams
from vectordb.errors import InvalidVectorsError
from vectordb.gather import Answer, SearchGatherer
from vectordb.metric import Metric, prepare, to_scores
from vectordb.posting_format import PAGE_BYTES
from vectordb.posting_store import SPARE_LIMIT_BYTES
from vectordb.scoring import Access
from vectordb.search_chunk import ChunkAnswer, note_corrupt_lists, search_chunk
from vectordb.search_result import SearchResult

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["search"]

_SPLIT_NAVIGATION_AT = 64  # queries: below this the head scan runs on the loop thread alone
_READ_WHILE_NAVIGATING_AT = 128  # queries: from here reads start during the head scan
_PIECE_QUERIES = 32  # queries the loop thread navigates between two starts of reads
_FRONT_SHARE = 0.5  # of a batch's queries navigated on the loop thread (measured: 0.25-0.5 alike)
_CELL_BUDGET = 1 << 22  # (probe, record) distances held at once: chunks huge batches
# queries a batch may have to be searched in one piece on the loop thread: one read, scored
# inline (a lone query's ~8 lists score in ~50 us; a thread hop and three more groups cost more)
SMALL_BATCH_QUERIES = 16
READ_BUFFER_BYTES = SPARE_LIMIT_BYTES - PAGE_BYTES  # one reusable buffer for a chunk's reads
# the lists a chunk may read (their own pages); the rest of the buffer is room for the gaps
# reads run through (batch_reads.BRIDGE_PAGES)
READ_BUDGET_BYTES = READ_BUFFER_BYTES * 3 // 4


async def search(index: SpannIndex, queries: Any, k: int, params: SearchParams) -> SearchResult:
    queries = check_queries(queries, index.config.dim)
    k = check_k(k, index.versions.live_count)
    if len(queries) <= SMALL_BATCH_QUERIES:  # concurrent small searches share batches
        prepared = prepare(index.metric, queries)
        ids, dist, bad = await _gatherer(index).search(prepared, k, params)
        # (the gathered batch's scratch is returned by run_batch, once per batch)
    else:
        ids, dist, bad = await _run_slices(index, queries, k, params)
    return SearchResult(ids, to_scores(index.metric, dist), bad)


async def _run_slices(
    index: SpannIndex, queries: np.ndarray, k: int, params: SearchParams
) -> Answer:
    """A batch in one piece; at the floor of a memory budget (``memory.tight``), in slices
    of ``memory.batch_queries`` queries one after another, each prepared when its turn comes:
    a batch's own arrays (navigation, ordering, masks: ~2-3 KB a query at 43 lists, and the
    prepared copy of the queries) then do not grow with the caller's batch (measured on
    debian-minilm at 13.7 MiB: a batch of 500 at 43 lists peaked ~4.4 MiB over the opened
    index and was killed; slices share fewer lists, so a slice reads a little more)."""
    step = index.memory.batch_queries if index.memory.tight else len(queries)
    if step >= len(queries):
        return await run_batch(index, prepare(index.metric, queries), k, params)
    out_ids = np.full((len(queries), k), -1, np.int64)
    out_dist = np.full((len(queries), k), np.inf, np.float32)
    skipped = []
    for first in range(0, len(queries), step):
        rows = slice(first, min(first + step, len(queries)))
        ids, dist, bad = await run_batch(index, prepare(index.metric, queries[rows]), k, params)
        out_ids[rows], out_dist[rows] = ids, dist
        skipped.append(bad)
    return out_ids, out_dist, np.unique(np.concatenate(skipped))


def _gatherer(index: SpannIndex) -> SearchGatherer:
    if index.gatherer is None:
        memory = index.memory  # each batch in flight holds a read buffer and its scratch
        index.gatherer = SearchGatherer(
            functools.partial(run_batch, index),
            max_batch_queries=memory.batch_queries,
            max_in_flight=memory.chunks_in_flight,
        )
    return index.gatherer


async def run_batch(
    index: SpannIndex,
    queries: np.ndarray,
    k: int,
    params: SearchParams,
    access: Access | None = None,
) -> Answer:
    """(ids, internal distances, skipped lists) of prepared ``queries``, searched together.
    ``access``: (may_read(ids, query rows) -> mask, query rows' tenants): a record a query
    may not read is left out while scoring (vectordb.tenancy's filtered route)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    index.searches.add(done)
    try:
        with single_threaded_blas():
            return await _search(index, queries, int(k), params, access)
    finally:
        index.searches.discard(done)
        done.set_result(None)
        index.memory.after_batch(len(queries), SMALL_BATCH_QUERIES)


def check_k(k: Any, live_vectors: int) -> int:
    """``k`` as an int; above the index's live vectors it is cut to them (at least 1), so a
    huge ``k`` costs no more than the index holds (``k=10**9`` tried to allocate 14.9 GiB)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k <= 0:
        raise InvalidVectorsError(f"k must be a positive integer, got {k!r}")
    return int(min(int(k), max(live_vectors, 1)))


def check_queries(queries: Any, dim: int) -> np.ndarray:
    try:
        array = np.asarray(queries, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidVectorsError(f"queries are not numeric: {exc}") from None
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] != dim:
        raise InvalidVectorsError(f"queries must be [n, {dim}], got shape {array.shape}")
    if not np.isfinite(array).all():
        raise InvalidVectorsError("queries contain NaN or inf")
    return array


def _prune(metric: Metric, pids: np.ndarray, dist: np.ndarray, ratio: float) -> np.ndarray:
    keep = pids >= 0
    if metric is Metric.IP:
        return keep
    l2 = dist if metric is Metric.L2 else np.maximum(2.0 + 2.0 * dist, 0.0)
    # A query sitting on a head (distance ~0) would prune every other list; like SPTAG's
    # "nearest > 0.1" guard, but scale-free: the reference is at least a quarter of the
    # second-nearest head's distance.
    second = l2[:, 1:2] if l2.shape[1] > 1 else l2[:, :1]
    reference = np.maximum(l2[:, :1], 0.25 * np.where(np.isfinite(second), second, 0.0))
    return keep & (l2 <= ratio * np.maximum(reference, 1e-12))


async def _search(
    index: SpannIndex, queries: np.ndarray, k: int, params: SearchParams, access: Access | None
) -> Answer:
    n_queries = len(queries)
    want = params.max_postings or index.default_max_postings
    if params.max_postings is None and n_queries <= SMALL_BATCH_QUERIES:
        # a few queries share few lists, so they lack the boost shared lists give a batch:
        # a quarter more lists each (debian-minilm, one query a call: recall@10 0.919 at 8
        # lists, 0.934 at 10, for 1.69 -> 1.71 ms)
        want += want // 4
    extra = want if params.shared_postings is None else params.shared_postings
    if n_queries == 1:
        extra = 0  # a lone query's own lists are all the batch reads: nothing to share
    early: BatchReads | None = None
    if n_queries >= _READ_WHILE_NAVIGATING_AT:
        navigated = await _navigate_reading(index, queries, want, extra, params.prune_ratio)
        pids, head_dist, early, early_queries = navigated
    else:
        pids, head_dist = _navigate(index, queries, want + extra)
        early_queries = 0
    keep = _prune(index.metric, pids, head_dist, params.prune_ratio)
    shared = keep.copy()  # candidates beyond the first ``want``: scored if read anyway
    keep[:, want:] = False
    shared[:, :want] = False
    order = locality_order(pids, early_queries)
    pids, keep, shared = pids[order], keep[order], shared[order]
    out_ids = np.full((n_queries, k), -1, np.int64)
    out_dist = np.full((n_queries, k), np.inf, np.float32)
    budgets = (_read_budget_bytes(index) // PAGE_BYTES, _cell_budget(index))
    chunks = [slice(0, 1)]  # a lone query is one chunk, whatever its lists' size
    if n_queries > 1:
        chunks = query_chunks(index.store, pids, keep, *budgets, first_at_least=early_queries)
    if len(chunks) == 1 and n_queries <= SMALL_BATCH_QUERIES and early is None:
        ids, dist, bad = await search_chunk(
            index, queries[order], pids, keep, shared, k, params, inline=True,
            access=_rows_access(access, order),
        )  # fmt: skip
        out_ids[order], out_dist[order] = ids, dist
        return _finish(index, out_ids, out_dist, [bad])
    running: list[tuple[slice, asyncio.Future[ChunkAnswer]]] = []
    skipped: list[np.ndarray] = []
    try:
        for rows in chunks:
            reads, early = early, None  # the early reads belong to the first chunk
            landed = asyncio.Event()
            chunk = search_chunk(
                index, queries[order[rows]], pids[rows], keep[rows], shared[rows], k, params,
                reads, landed, access=_rows_access(access, order[rows]),
            )  # fmt: skip
            running.append((rows, asyncio.ensure_future(chunk)))
            # the next chunk's reads start once this one's have landed (the device would idle
            # through its last scoring and top-k); at most two chunks hold read buffers, one
            # under a tight memory budget (memory_budget.py)
            await asyncio.wait(  # type: ignore[type-var]
                [asyncio.ensure_future(landed.wait()), running[-1][1]],
                return_when=asyncio.FIRST_COMPLETED,
            )
            if len(running) >= index.memory.chunks_in_flight:
                done_rows, task = running.pop(0)
                ids, dist, bad = await task
                out_ids[order[done_rows]], out_dist[order[done_rows]] = ids, dist
                skipped.append(bad)
        for done_rows, task in running:
            ids, dist, bad = await task
            out_ids[order[done_rows]], out_dist[order[done_rows]] = ids, dist
            skipped.append(bad)
        running = []
    finally:
        if early is not None:  # never handed to a chunk: nothing was kept
            await early.finish()
        if running:  # a chunk failed: the others still own buffers the device writes into
            await asyncio.gather(*(task for _, task in running), return_exceptions=True)
    return _finish(index, out_ids, out_dist, skipped)


def _rows_access(access: Access | None, rows: np.ndarray) -> Access | None:
    return None if access is None else (access[0], access[1][rows])


def _finish(
    index: SpannIndex, out_ids: np.ndarray, out_dist: np.ndarray, skipped: list[np.ndarray]
) -> Answer:
    index.counters["queries"] += len(out_ids)
    bad = np.unique(np.concatenate(skipped)) if skipped else np.zeros(0, np.int64)
    if len(bad):
        note_corrupt_lists(index, bad)
    return out_ids, out_dist, bad


def _read_buffer_bytes(index: SpannIndex) -> int:
    """One chunk's read buffer: the default, or what the memory budget gives it."""
    return min(READ_BUFFER_BYTES, index.memory.read_buffer_bytes or READ_BUFFER_BYTES)


def _read_budget_bytes(index: SpannIndex) -> int:
    """The lists one chunk may read; the rest of its buffer is room for gaps read through."""
    return min(READ_BUDGET_BYTES, _read_buffer_bytes(index) * 3 // 4)


def _cell_budget(index: SpannIndex) -> int:
    """(probe, record) cells a chunk scores at once: under a memory budget, about as many
    bytes of distance matrices (~64 a cell with the top-k's copies and sorts) as its read
    buffer."""
    read = index.memory.read_buffer_bytes
    return _CELL_BUDGET if read is None else max(1, min(_CELL_BUDGET, read // 64))


def _navigate(index: SpannIndex, queries: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
    """The navigator's answer; a large batch is split between the loop thread and the scoring
    thread. The loop thread waits without yielding, so no update can change the heads
    meanwhile."""
    if len(queries) < _SPLIT_NAVIGATION_AT:
        return index.navigator.search(queries, want)
    half = len(queries) // 2
    other = index.scorer.submit(index.navigator.search, queries[half:], want)
    pids, dist = index.navigator.search(queries[:half], want)
    other_pids, other_dist = other.result()
    return np.concatenate([pids, other_pids]), np.concatenate([dist, other_dist])


async def _navigate_reading(
    index: SpannIndex, queries: np.ndarray, want: int, extra: int, prune_ratio: float
) -> tuple[np.ndarray, np.ndarray, BatchReads, int]:
    """Navigate a large batch and start reading lists before it is done: the scoring thread
    scans the back half of the heads in one go while the loop thread scans the front half a
    piece at a time, starting the reads of each piece's new lists (and yielding, so they are
    submitted and reaped) before the next piece. The device starts about when the first piece
    is scanned instead of after the whole batch. Returns (pids, distances, the reads, how many
    leading queries had their lists read); reads stop once the buffer would overflow."""
    half = int(len(queries) * _FRONT_SHARE)
    search_heads = index.navigator.search
    # updaters leave the heads alone until the whole batch is navigated: the loop thread
    # yields between pieces, and a split then would give pieces of different widths
    back = asyncio.wrap_future(index.scorer.submit(search_heads, queries[half:], want + extra))
    navigating = asyncio.get_running_loop().create_future()
    index.head_scans.add(navigating)
    reads = BatchReads(index.store, _read_buffer_bytes(index))
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    early_queries = 0
    try:
        for first in range(0, half, _PIECE_QUERIES):
            piece = queries[first : min(first + _PIECE_QUERIES, half)]
            pids, dist = search_heads(piece, want + extra)
            parts.append((pids, dist))
            if early_queries < first:
                continue  # an earlier piece did not fit: the rest waits for the chunks
            kept = pids[:, :want][_prune(index.metric, pids, dist, prune_ratio)[:, :want]]
            new = np.setdiff1d(np.unique(kept), reads.pids, assume_unique=True)
            if not reads.fits(new):
                continue
            reads.start(new)
            early_queries = first + len(pids)
            await asyncio.sleep(0)  # the loop submits the read (and reaps earlier ones)
        parts.append(await back)
    except BaseException:
        await asyncio.wait([back])
        await reads.finish()
        raise
    finally:
        index.head_scans.discard(navigating)
        navigating.set_result(None)
    return (
        np.concatenate([p for p, _ in parts]),
        np.concatenate([d for _, d in parts]),
        reads,
        early_queries,
    )
