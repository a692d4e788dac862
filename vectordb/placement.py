"""Which posting lists a vector goes to: SPANN's closure with the RNG rule.

Among a vector's nearest ``candidate_heads`` heads, nearest first, head ``h`` is accepted unless
an already accepted head ``a`` is closer to it than the vector is (``rng_factor * d(h, a) <
d(x, h)``): replicas then point in different directions instead of piling into neighbouring lists
that would be read together anyway. Past the nearest, a head is also skipped when farther than
``closure`` x the nearest head's distance (SPANN's closure: only vectors near a boundary are
replicated). At most ``replica_count`` heads are accepted. Distances here
are squared L2 in every metric (for cosine the vectors are unit length, where L2 and cosine order
agree; for inner product it is the geometric reading SPANN uses).

Vectorised over a batch of vectors: one faiss search, one batched Gram matrix of the candidate
heads per vector, then a loop over candidate ranks (not over vectors).
Thread-safety: pure, given a navigator that is not being modified.
"""

from __future__ import annotations

import numpy as np

from vectordb.config import IndexConfig
from vectordb.metric import Metric
from vectordb.navigator import Navigator

__all__ = ["place"]

_RNG_CANDIDATES = 16  # candidates the RNG rule examines (SPANN: 64; 16 find ~6 replicas here)
_CHUNK = 512


def place(vectors: np.ndarray, navigator: Navigator, config: IndexConfig) -> np.ndarray:
    """pids int64 [n, replica_count], nearest first, padded with -1. ``vectors`` prepared."""
    n = len(vectors)
    out = np.full((n, config.replica_count), -1, np.int64)
    n_candidates = min(config.candidate_heads, _RNG_CANDIDATES, navigator.n_heads)
    if n == 0 or n_candidates == 0:
        return out
    for start in range(0, n, _CHUNK):
        chunk = vectors[start : start + _CHUNK]
        pids, dist = navigator.search(chunk, n_candidates)
        out[start : start + len(chunk)] = _rng_select(chunk, pids, dist, navigator, config)
    return out


def _rng_select(
    x: np.ndarray, pids: np.ndarray, dist: np.ndarray, navigator: Navigator, config: IndexConfig
) -> np.ndarray:
    n, c = pids.shape
    valid = pids >= 0
    unique, inverse = np.unique(np.where(valid, pids, pids.max()), return_inverse=True)
    heads = navigator.vectors_of(unique)[inverse.reshape(n, c)]  # [n, c, dim]
    head_norms = np.einsum("ncd,ncd->nc", heads, heads)
    gram = np.matmul(heads, heads.transpose(0, 2, 1))
    head_dist = head_norms[:, :, None] + head_norms[:, None, :] - 2.0 * gram  # [n, c, c]
    metric = Metric(config.metric)
    if metric is Metric.L2:
        x_dist = dist
    elif metric is Metric.COSINE:
        x_dist = 2.0 + 2.0 * dist  # |x - h|^2 = 2 - 2 cos for unit vectors
    else:
        x_dist = np.einsum("nd,nd->n", x, x)[:, None] + head_norms + 2.0 * dist
    accepted = np.zeros((n, c), bool)
    counts = np.zeros(n, np.int64)
    for j in range(c):
        ok = valid[:, j] & (counts < config.replica_count)
        if j:
            if config.closure != float("inf"):  # skipped, not multiplied: inf * 0 is nan
                ok &= x_dist[:, j] <= config.closure * np.maximum(x_dist[:, 0], 0.0)
            too_close = config.rng_factor * head_dist[:, j, :j] < x_dist[:, j : j + 1]
            ok &= ~(accepted[:, :j] & too_close).any(axis=1)
        accepted[:, j] = ok
        counts += ok
        if not (counts < config.replica_count).any():
            break
    out = np.full((n, config.replica_count), -1, np.int64)
    rows, cols = np.nonzero(accepted)
    rank = np.cumsum(accepted, axis=1)[rows, cols] - 1
    out[rows, rank] = pids[rows, cols]
    return out
