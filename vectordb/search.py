"""Search: navigate the heads, prune, read every needed list of the batch at once, rerank.

For a batch of queries:

1. the navigator gives each query its ``max_postings`` nearest heads;
2. a head farther than ``prune_ratio`` x the nearest head's distance (squared L2; for cosine
   computed from the similarity; not applied to raw inner product) is skipped;
3. the union of the lists over the whole batch is read in ONE I/O-core submission (a list two
   queries need is read once) and every record's check word is verified;
4. stale copies (older version) and deleted ids are masked out with one version-map lookup;
5. per query, exact distances to the records of its lists, duplicates (replicas) dropped, the
   best ``k`` kept.

Lists seen with few live vectors are noted for merging (done by the next update).
Concurrency: runs beside other searches and one updater (see posting_store for why reads
stay consistent); registers itself in ``index.searches`` so a checkpoint can wait for it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np

from vectordb.config import SearchParams
from vectordb.errors import InvalidVectorsError
from vectordb.metric import Metric, prepare, to_scores

if TYPE_CHECKING:
    from vectordb.index import SpannIndex

__all__ = ["search"]


async def search(
    index: SpannIndex, queries: Any, k: int, params: SearchParams
) -> tuple[np.ndarray, np.ndarray]:
    queries = _check_queries(queries, index.config.dim)
    if not isinstance(k, (int, np.integer)) or k <= 0:
        raise InvalidVectorsError(f"k must be a positive integer, got {k!r}")
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    index.searches.add(done)
    try:
        return await _search(index, prepare(index.metric, queries), int(k), params)
    finally:
        index.searches.discard(done)
        done.set_result(None)


def _check_queries(queries: Any, dim: int) -> np.ndarray:
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
    l2 = dist if metric is Metric.L2 else 2.0 + 2.0 * dist
    nearest = np.maximum(l2[:, :1], 1e-12)
    return keep & (l2 <= ratio * nearest)


async def _search(
    index: SpannIndex, queries: np.ndarray, k: int, params: SearchParams
) -> tuple[np.ndarray, np.ndarray]:
    n_queries = len(queries)
    out_ids = np.full((n_queries, k), -1, np.int64)
    out_dist = np.full((n_queries, k), np.inf, np.float32)
    pids, head_dist = index.navigator.search(queries, params.max_postings)
    keep = _prune(index.metric, pids, head_dist, params.prune_ratio)
    unique, inverse = np.unique(pids[keep], return_inverse=True)
    batch = await index.store.read(unique)
    records = batch.records
    valid = index.versions.valid(records["id"], records["version"])
    _note_small_lists(index, unique, batch.starts, valid)
    vectors = np.ascontiguousarray(records["vector"], dtype=np.float32)
    ids = records["id"]
    lens = np.diff(batch.starts)
    slot = np.full(pids.shape, -1, np.int64)
    slot[keep] = inverse
    for q in range(n_queries):
        lists = slot[q][slot[q] >= 0]
        rows = _ranges(batch.starts[lists], lens[lists])
        rows = rows[valid[rows]]
        if len(rows) == 0:
            continue
        found_ids, found_dist = _top_k(index.metric, queries[q], vectors[rows], ids[rows], k)
        out_ids[q, : len(found_ids)] = found_ids
        out_dist[q, : len(found_ids)] = found_dist
    index.counters["queries"] += n_queries
    return out_ids, to_scores(index.metric, out_dist)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), without a Python loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return offsets + np.arange(total)


def _top_k(
    metric: Metric, query: np.ndarray, vectors: np.ndarray, ids: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    if metric is Metric.L2:
        diff = vectors - query
        dist = np.einsum("ij,ij->i", diff, diff)
    else:
        dist = -(vectors @ query)
    want = min(len(dist), k * 4)  # replicas: a few copies of one id may crowd the top k
    while True:
        part = np.argpartition(dist, want - 1)[:want] if want < len(dist) else np.arange(len(dist))
        part = part[np.argsort(dist[part], kind="stable")]
        _, first = np.unique(ids[part], return_index=True)
        first.sort()
        if len(first) >= k or want >= len(dist):
            chosen = part[first[:k]]
            return ids[chosen], dist[chosen]
        want = min(len(dist), want * 4)


def _note_small_lists(
    index: SpannIndex, pids: np.ndarray, starts: np.ndarray, valid: np.ndarray
) -> None:
    if len(pids) == 0 or index.config.merge_threshold == 0:
        return
    owner = np.repeat(np.arange(len(pids)), np.diff(starts))  # empty lists are fine here
    live = np.bincount(owner[valid], minlength=len(pids))
    small = pids[live <= index.config.merge_threshold]
    if len(small) and index.navigator.n_heads > 1:
        index.merge_candidates.update(small.tolist())
