"""The navigator's exact flat scan of its heads (float32, or float16 widened piece by piece).

One BLAS matrix product per query chunk in numpy (3x faster than faiss's flat index on this
machine); float16 heads (a tight memory budget) are widened ``widen_heads`` at a time into the
calling thread's scratch (widen.py), never all at once: a float32 copy of every head is what
such a budget cannot hold. Distances are the index's internal ones (metric.py).
Thread-safety: pure functions over arrays the caller does not change meanwhile.
"""

from __future__ import annotations

import numpy as np

from vectordb.metric import Metric
from vectordb.widen import widen_float16

__all__ = ["WIDEN_HEADS", "nearest", "products", "squared_norms"]

WIDEN_HEADS = 256  # float16 heads widened at a time (384 KiB of scratch at 384-d; a memory
# budget may lower it: Navigator.widen_heads)


def products(queries: np.ndarray, heads: np.ndarray, widen_heads: int) -> np.ndarray:
    """queries x heads, float32 [Q, heads]; float16 heads widened a piece at a time."""
    if heads.dtype == np.float32:
        return queries @ heads.T
    out = np.empty((len(queries), len(heads)), np.float32)
    for first in range(0, len(heads), widen_heads):
        piece = heads[first : first + widen_heads]
        wide = widen_float16(piece.reshape(-1)).reshape(piece.shape)
        np.matmul(queries, wide.T, out=out[:, first : first + len(piece)])
    return out


def nearest(
    queries: np.ndarray,
    heads: np.ndarray,
    norms: np.ndarray,
    metric: Metric,
    want: int,
    widen_heads: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(distances float32 [Q, want], positions int64 [Q, want]) of each query's ``want``
    nearest heads, nearest first; ``norms``: the heads' |h|^2 (L2 only)."""
    dist = products(queries, heads, widen_heads)
    if metric is Metric.L2:
        dist = norms - 2.0 * dist
        dist += np.einsum("ij,ij->i", queries, queries)[:, None]
    else:
        np.negative(dist, out=dist)
    if want < dist.shape[1]:
        pos = np.argpartition(dist, want - 1, axis=1)[:, :want]
    else:
        pos = np.broadcast_to(np.arange(dist.shape[1]), dist.shape).copy()
    part = np.take_along_axis(dist, pos, axis=1)
    order = np.argsort(part, axis=1, kind="stable")
    pos = np.take_along_axis(pos, order, axis=1)
    return np.take_along_axis(part, order, axis=1), pos


def squared_norms(vectors: np.ndarray) -> np.ndarray:
    """|v|^2 of each row in float32; float16 rows widened a piece at a time."""
    if vectors.dtype == np.float32:
        return np.einsum("ij,ij->i", vectors, vectors)
    out = np.empty(len(vectors), np.float32)
    for first in range(0, len(vectors), WIDEN_HEADS):
        wide = vectors[first : first + WIDEN_HEADS].astype(np.float32)
        out[first : first + len(wide)] = np.einsum("ij,ij->i", wide, wide)
    return out
