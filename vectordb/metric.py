"""Distance metrics: how vectors are prepared, compared and ranked.

The index works internally with a *distance* where smaller is nearer for every metric:

- ``l2``: squared Euclidean distance (no square root, as faiss and SPTAG).
- ``ip``: negative inner product.
- ``cosine``: vectors (and queries) are L2-normalised on the way in, then as ``ip``.

The public search result reports what users of faiss expect: squared L2 distances ascending for
``l2``, similarities (inner product, cosine) descending for ``ip`` and ``cosine``.
Thread-safety: stateless; every function is pure.
"""

from __future__ import annotations

import enum

import numpy as np

__all__ = ["Metric", "distances", "pairwise_distances", "prepare", "to_scores"]


class Metric(enum.StrEnum):
    L2 = "l2"
    IP = "ip"
    COSINE = "cosine"

    @property
    def faiss_metric(self) -> int:
        import faiss

        return faiss.METRIC_L2 if self is Metric.L2 else faiss.METRIC_INNER_PRODUCT


def prepare(metric: Metric, vectors: np.ndarray) -> np.ndarray:
    """Float32 copy ready for distance math (normalised for cosine; zero vectors stay zero)."""
    out = np.array(vectors, dtype=np.float32, copy=True)
    if metric is Metric.COSINE:
        norms = np.linalg.norm(out, axis=-1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
    return out


def pairwise_distances(metric: Metric, queries: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """float32 [len(queries), len(vectors)] distances (smaller is nearer); inputs prepared."""
    dots = queries @ vectors.T
    if metric is Metric.L2:
        q_norms = np.einsum("ij,ij->i", queries, queries)[:, None]
        v_norms = np.einsum("ij,ij->i", vectors, vectors)[None, :]
        out = q_norms + v_norms - 2.0 * dots
        return np.maximum(out, 0.0, out=out)
    return np.negative(dots, out=dots)


def distances(metric: Metric, query: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """float32 [len(vectors)] distances from one prepared query (smaller is nearer)."""
    if metric is Metric.L2:
        diff = vectors - query
        return np.einsum("ij,ij->i", diff, diff)
    return -(vectors @ query)


def to_scores(metric: Metric, internal: np.ndarray) -> np.ndarray:
    """Internal distances to the reported figure: L2 stays, ip/cosine become similarities."""
    return internal if metric is Metric.L2 else -internal
