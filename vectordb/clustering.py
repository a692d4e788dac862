"""Head selection by hierarchical balanced k-means (SPANN's step 1), and 2-means for splits.

``select_heads`` splits the data recursively with faiss k-means (at most ``BRANCHING`` children
per split, trained on a sample) until every cluster holds at most ``_LEAF_LIMIT_OVER_MEAN /
head_fraction`` vectors (1.9 / head_fraction); leaves come out about half that limit on average,
so about ``head_fraction`` of the vectors become heads (8% by default). Each leaf contributes
one head: its member nearest the leaf's mean (heads are real vectors, as in SPANN). Clusters
that k-means leaves lopsided are simply split further, which keeps leaves near the target size,
the property SPANN's balance penalty exists for.

Heads come out in the tree's depth-first order, so heads adjacent in that order are near each
other in space: build numbers posting lists in it and lays them out on disk in it, so lists a
query batch needs together often sit side by side and are read in one request.

Thread-safety: pure functions (faiss uses its own OpenMP threads).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import faiss
import numpy as np

__all__ = ["BRANCHING", "medoid", "select_heads", "two_means"]

BRANCHING = 32
_SAMPLE_PER_CENTROID = 64
_KMEANS_ITERATIONS = 12
_LEAF_LIMIT_OVER_MEAN = 1.9
_TWO_MEANS_ITERATIONS = 8


def select_heads(
    vectors: np.ndarray,
    head_fraction: float,
    seed: int = 0,
    on_progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Row indices of the chosen heads, unique, in depth-first order of the k-means tree.
    ``vectors``: prepared float32 [n, dim]."""
    n = len(vectors)
    if n == 0:
        return np.zeros(0, np.int64)
    # leaves come out about half the size limit on average (a split of s rows into ceil(s / L)
    # children, re-split when lopsided), so the limit is ~2x the mean leaf the fraction asks for
    leaf_size = max(1, round(_LEAF_LIMIT_OVER_MEAN / head_fraction))
    rng = np.random.default_rng(seed)
    heads: list[int] = []
    stack = [np.arange(n, dtype=np.int64)]
    while stack:
        rows = stack.pop()
        if len(rows) <= leaf_size:
            heads.append(medoid(vectors, rows))
            if on_progress is not None:
                on_progress(len(rows))
            continue
        k = min(BRANCHING, -(-len(rows) // leaf_size))
        labels = _kmeans_labels(vectors[rows], k, rng)
        order = np.argsort(labels, kind="stable")
        bounds = np.searchsorted(labels[order], np.arange(k + 1))
        children = [rows[order[a:b]] for a, b in itertools.pairwise(bounds)]
        children = [c for c in children if len(c)]
        if len(children) == 1:  # k-means could not separate them (duplicates): cut by position
            children = np.array_split(rows, k)
        stack.extend(reversed(children))  # popped first child first: depth-first order
    return np.asarray(heads, np.int64)


def two_means(vectors: np.ndarray, seed: int = 0) -> np.ndarray:
    """Labels (0/1) splitting ``vectors`` in two, each side non-empty when n >= 2.

    Plain numpy Lloyd iterations from a far-apart pair: a split is small (a list of ~100
    vectors) and faiss's per-call set-up would cost more than the clustering.
    """
    n = len(vectors)
    if n < 2:
        return np.zeros(n, np.int64)
    x = np.asarray(vectors, np.float32)
    rng = np.random.default_rng(seed)
    first = x[rng.integers(n)]
    a = x[np.argmax(((x - first) ** 2).sum(axis=1))]
    b = x[np.argmax(((x - a) ** 2).sum(axis=1))]
    labels = np.zeros(n, np.int64)
    for _ in range(_TWO_MEANS_ITERATIONS):
        new = (((x - b) ** 2).sum(axis=1) < ((x - a) ** 2).sum(axis=1)).astype(np.int64)
        if new.min() == new.max():
            break
        if (new == labels).all():
            break
        labels = new
        a, b = x[labels == 0].mean(axis=0), x[labels == 1].mean(axis=0)
    if labels.min() == labels.max():  # all identical: cut by position
        labels = (np.arange(n) >= n // 2).astype(np.int64)
    return labels


def _kmeans_labels(vectors: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    n, dim = vectors.shape
    sample_size = min(n, k * _SAMPLE_PER_CENTROID)
    sample = vectors if sample_size == n else vectors[rng.choice(n, sample_size, replace=False)]
    kmeans = faiss.Kmeans(
        dim,
        k,
        niter=_KMEANS_ITERATIONS,
        seed=int(rng.integers(1 << 30)),
        min_points_per_centroid=1,
        max_points_per_centroid=_SAMPLE_PER_CENTROID * 4,
    )
    kmeans.train(np.ascontiguousarray(sample, np.float32))
    _, labels = kmeans.index.search(np.ascontiguousarray(vectors, np.float32), 1)
    return labels[:, 0]


def medoid(vectors: np.ndarray, rows: np.ndarray) -> int:
    """The row of ``rows`` nearest their mean (a real vector to serve as a head)."""
    members = vectors[rows]
    centre = members.mean(axis=0)
    diff = members - centre
    return int(rows[np.argmin(np.einsum("ij,ij->i", diff, diff))])
