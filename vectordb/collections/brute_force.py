"""Exact scoring of the points a caller may read and its filter matches (a full scan).

The last resort of a filtered query (query.py) whose index rounds came up short, and what
``exact=True`` asks for. Scores are those the collection reports: cosine similarity, inner
product (larger is nearer) or Euclidean distance (smaller is nearer).

Thread-safety: runs on a worker thread; reads the store in one read transaction.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vectordb.collections.filters import Filter
from vectordb.collections.point_records import PointRecord
from vectordb.collections.point_store import PointStore
from vectordb.collections.points import CollectionConfig, point_key

__all__ = ["exact_hits", "prepare_queries", "score_matrix"]

ExactHit = tuple[int, float, bytes, PointRecord]


def exact_hits(
    store: PointStore,
    config: CollectionConfig,
    queries: np.ndarray,
    need: int,
    filt: Filter | None,
    tenant: str | None,
    score_ok: Callable[[float], bool],
) -> list[list[ExactHit]]:
    """The ``need`` best matching points for each query row."""
    ids: list[int] = []
    records: list[PointRecord] = []
    for internal_id, record in store.scan():
        if tenant is not None and tenant not in record.tenants:
            continue
        if filt is not None and not filt.matches(record.point_id, record.payload):
            continue
        ids.append(internal_id)
        records.append(record)
    if not records:
        return [[] for _ in range(len(queries))]
    scores = score_matrix(
        config.distance,
        prepare_queries(config.distance, queries),
        np.stack([r.vector for r in records]),
    )
    out = []
    for row in scores:
        order = np.argsort(row if config.distance == "Euclid" else -row, kind="stable")[:need]
        hits = []
        for j in order.tolist():
            score = float(row[j])
            if not score_ok(score):
                break
            hits.append((ids[j], score, point_key(records[j].point_id), records[j]))
        out.append(hits)
    return out


def prepare_queries(distance: str, queries: np.ndarray) -> np.ndarray:
    out = np.asarray(queries, dtype=np.float32)
    if distance == "Cosine":
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = np.divide(out, norms, out=np.zeros_like(out), where=norms > 0)
    return out


def score_matrix(distance: str, queries: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """[queries, vectors] scores; stored Cosine vectors are normalised already."""
    if distance != "Euclid":
        return queries @ vectors.T
    squared = (queries**2).sum(1)[:, None] - 2 * queries @ vectors.T + (vectors**2).sum(1)[None, :]
    return np.sqrt(np.maximum(squared, 0.0))
