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
    l2 = dist if metric is Metric.L2 else np.maximum(2.0 + 2.0 * dist, 0.0)
    # A query sitting on a head (distance ~0) would prune every other list; like SPTAG's
    # "nearest > 0.1" guard, but scale-free: the reference is at least a quarter of the
    # second-nearest head's distance.
    second = l2[:, 1:2] if l2.shape[1] > 1 else l2[:, :1]
    reference = np.maximum(l2[:, :1], 0.25 * np.where(np.isfinite(second), second, 0.0))
    return keep & (l2 <= ratio * np.maximum(reference, 1e-12))


async def _search(
    index: SpannIndex, queries: np.ndarray, k: int, params: SearchParams
) -> tuple[np.ndarray, np.ndarray]:
    n_queries = len(queries)
    pids, head_dist = index.navigator.search(queries, params.max_postings)
    keep = _prune(index.metric, pids, head_dist, params.prune_ratio)
    unique, inverse = np.unique(pids[keep], return_inverse=True)
    probe_query = np.nonzero(keep)[0]  # the query of each kept (query, list) probe
    lists = await index.store.read_views(unique)
    by_list = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[by_list], np.arange(len(unique) + 1))
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    live_counts = np.zeros(len(unique), np.int64)
    sizes = np.array([len(r) for r in lists], np.int64)
    if sizes.sum():  # one version-map lookup for every record read
        all_valid = index.versions.valid(
            np.concatenate([r["id"] for r in lists]),
            np.concatenate([r["version"] for r in lists]),
        )
    else:
        all_valid = np.zeros(0, bool)
    ends = np.cumsum(sizes)
    for slot, records in enumerate(lists):
        valid = all_valid[ends[slot] - sizes[slot] : ends[slot]]
        live_counts[slot] = int(valid.sum())
        if not live_counts[slot]:
            continue
        who = probe_query[by_list[bounds[slot] : bounds[slot + 1]]]
        found.append(_score_list(index.metric, records[valid], queries, who, k))
    _note_small_lists(index, unique, live_counts)
    index.counters["queries"] += n_queries
    out_ids, out_dist = _best_per_query(found, n_queries, k)
    return out_ids, to_scores(index.metric, out_dist)


def _score_list(
    metric: Metric, records: np.ndarray, queries: np.ndarray, who: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query, id, distance) of the nearest ``k`` records of one list for each query in ``who``.

    The vectors are a strided view into the read buffer: BLAS takes it as is, nothing copied
    (uint8 lists are converted, being 4x smaller)."""
    vectors = records["vector"]
    if vectors.dtype != np.float32:
        vectors = vectors.astype(np.float32)
    mine = queries[who]
    dist = vectors @ mine.T  # [records, queries]
    if metric is Metric.L2:
        dist *= -2.0
        dist += np.einsum("ij,ij->i", vectors, vectors)[:, None]
        dist += np.einsum("ij,ij->i", mine, mine)[None, :]
    else:
        np.negative(dist, out=dist)
    ids = records["id"]
    if len(ids) > k:
        rows = np.argpartition(dist, k - 1, axis=0)[:k]  # [k, queries]
        dist = np.take_along_axis(dist, rows, axis=0)
        ids = ids[rows]
    else:
        ids = np.broadcast_to(ids[:, None], dist.shape)
    return np.broadcast_to(who, dist.shape).ravel(), ids.ravel(), dist.ravel()


def _best_per_query(
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_queries: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per query, the ``k`` nearest distinct ids over all its lists (replicas counted once)."""
    out_ids = np.full((n_queries, k), -1, np.int64)
    out_dist = np.full((n_queries, k), np.inf, np.float32)
    if not found:
        return out_ids, out_dist
    query = np.concatenate([f[0] for f in found])
    ids = np.concatenate([f[1] for f in found])
    dist = np.concatenate([f[2] for f in found])
    order = np.lexsort((dist, ids, query))  # by query, then id, nearest copy first
    query, ids, dist = query[order], ids[order], dist[order]
    first = np.ones(len(query), bool)
    first[1:] = (query[1:] != query[:-1]) | (ids[1:] != ids[:-1])
    query, ids, dist = query[first], ids[first], dist[first]
    order = np.lexsort((dist, query))
    query, ids, dist = query[order], ids[order], dist[order]
    rank = np.arange(len(query)) - np.searchsorted(query, query)
    take = rank < k
    out_ids[query[take], rank[take]] = ids[take]
    out_dist[query[take], rank[take]] = dist[take]
    return out_ids, out_dist


def _note_small_lists(index: SpannIndex, pids: np.ndarray, live: np.ndarray) -> None:
    if len(pids) == 0 or index.config.merge_threshold == 0 or index.navigator.n_heads <= 1:
        return
    small = pids[live <= index.config.merge_threshold]
    if len(small):
        index.merge_candidates.update(small.tolist())
