"""CompactHnsw: the navigator's graph over float16 heads, for a tight memory budget.

A float32 HNSW (faiss ``IndexHNSWFlat``) holds every head at 4 bytes a dimension plus its links:
at 165k heads of 384 dimensions, 312 MiB, 71% of a budget of 15% of 2M vectors, and opening it
from a checkpoint's heads held a float32 copy of them beside faiss's own. Here the graph is
faiss HNSW over 8-bit scalar-quantised heads (``IndexHNSWSQ``, 1 byte a dimension), and the
heads themselves are kept once, in float16 (the checkpoint's array, taken as it is read): a
search asks the graph for a shortlist a little longer than wanted (SQ8 distances only order
it), then ranks the shortlist exactly on the float16 heads -- the distances a flat scan of the
float16 heads gives. Heads reach faiss ``_ADD_ROWS`` at a time, widened to float32 piece by
piece, so no float32 copy of all heads ever exists. The quantiser's range is each dimension's
minimum and maximum over the heads added first (later heads outside it are clipped in the
codes; the exact re-rank does not see the clipping).

Memory: codes (dim bytes a head) + links (~4 x 2M bytes a head) + float16 heads (2 x dim bytes
a head) + norms: ``nbytes``. At 165k x 384: ~240 MB, against 312 MiB float32 (and ~470 MB
while opening the float32 one). A re-rank widens at most ``widen_rows`` heads at a time.
Thread-safety: as Navigator's (searches may run on two threads; changes only while none does).
"""

from __future__ import annotations

import faiss
import numpy as np

from vectordb.metric import Metric
from vectordb.widen import widen_float16

__all__ = ["CompactHnsw"]

_HNSW_M = 32
_EF_CONSTRUCTION = 64  # as the float32 graph (at 40: recall of the heads 0.90 against 0.95)
_ADD_ROWS = 4096  # heads widened and handed to faiss at a time: 6 MiB of float32 at 384-d


def shortlist_size(want: int) -> int:
    """Heads the graph returns for ``want`` exact nearest: SQ8 rounding reorders neighbours
    that are close, so a margin of half as many again (at least 16) is ranked exactly."""
    return want + max(16, want // 2)


class CompactHnsw:
    def __init__(self, dim: int, metric: Metric) -> None:
        self.dim = dim
        self.metric = metric
        self._graph = faiss.IndexHNSWSQ(
            dim,
            faiss.ScalarQuantizer.QT_8bit,  # type: ignore[arg-type]
            _HNSW_M,
            metric.faiss_metric,
        )
        self._graph.hnsw.efConstruction = _EF_CONSTRUCTION
        self._heads = np.zeros((0, dim), np.float16)  # by graph position; rows past _n: room
        self._norms = np.zeros(0, np.float32)  # |head|^2 of the float16 heads (L2 only)
        self._n = 0
        self.widen_rows = 256  # heads widened at a time (a memory budget lowers it)

    @property
    def ntotal(self) -> int:
        return self._n

    def add(self, vectors: np.ndarray, take: bool = False) -> None:
        """Append heads (float16 or float32 rows). ``take``: a float16 array the caller lets go
        becomes the store itself when nothing is held yet (no second copy)."""
        n = len(vectors)
        if n == 0:
            return
        if take and self._n == 0 and vectors.dtype == np.float16 and vectors.flags.writeable:
            self._heads = np.ascontiguousarray(vectors)
        else:
            self._grow(self._n + n)
            self._heads[self._n : self._n + n] = vectors
        if not self._graph.is_trained:
            self._train(self._heads[self._n : self._n + n])
        norms = np.empty(n, np.float32)
        for first in range(0, n, _ADD_ROWS):
            piece = self._heads[self._n + first : self._n + min(n, first + _ADD_ROWS)]
            wide = piece.astype(np.float32)  # one piece at a time: never all heads in float32
            norms[first : first + len(piece)] = np.einsum("ij,ij->i", wide, wide)
            self._graph.add(wide)
        if self.metric is Metric.L2:
            if len(self._norms) < len(self._heads):
                grown = np.zeros(len(self._heads), np.float32)
                grown[: self._n] = self._norms[: self._n]
                self._norms = grown
            self._norms[self._n : self._n + n] = norms
        self._n += n

    def _grow(self, rows: int) -> None:
        if rows <= len(self._heads):
            return
        size = max(rows, len(self._heads) + len(self._heads) // 16, 64)  # memory is budget
        grown = np.zeros((size, self.dim), np.float16)
        grown[: self._n] = self._heads[: self._n]
        self._heads = grown

    def _train(self, first: np.ndarray) -> None:
        """The quantiser's per-dimension range: min and max of the first heads (QT_8bit's
        default range statistic is min-max, so two rows train it exactly)."""
        low = first.min(axis=0).astype(np.float32)
        high = first.max(axis=0).astype(np.float32)
        self._graph.train(np.stack([low, high]))

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """float16 heads at ``positions``."""
        return self._heads[positions]

    def reconstruct_batch(self, positions: np.ndarray) -> np.ndarray:
        return self._heads[positions].astype(np.float32)

    def search(self, queries: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
        """(internal distances float32 [Q, want], positions int64 [Q, want]; -1 past the
        heads found), nearest first, ranked on the float16 heads."""
        short = min(self._n, shortlist_size(want))
        self._graph.hnsw.efSearch = max(2 * short, 64)
        _, pos = self._graph.search(queries, short)
        dist = self._exact(queries, pos)
        order = np.argsort(dist, axis=1, kind="stable")[:, :want]
        return np.take_along_axis(dist, order, axis=1), np.take_along_axis(pos, order, axis=1)

    def _exact(self, queries: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Internal distances from each query to its shortlisted heads (inf where -1)."""
        n_queries, short = pos.shape
        flat_pos = pos.reshape(-1)
        rows = np.repeat(np.arange(n_queries), short)
        dots = np.zeros(len(flat_pos), np.float32)
        step = max(1, self.widen_rows)
        for first in range(0, len(flat_pos), step):
            where = flat_pos[first : first + step]
            piece = self._heads[np.maximum(where, 0)]
            wide = widen_float16(piece.reshape(-1)).reshape(piece.shape)
            dots[first : first + len(where)] = np.einsum(
                "ij,ij->i", wide, queries[rows[first : first + step]]
            )
        dist = dots.reshape(n_queries, short)
        if self.metric is Metric.L2:
            q_norms = np.einsum("ij,ij->i", queries, queries)[:, None]
            dist = self._norms[np.maximum(pos, 0)] - 2.0 * dist + q_norms
        else:
            np.negative(dist, out=dist)
        dist[pos < 0] = np.inf
        return dist

    @property
    def nbytes(self) -> int:
        """What it holds: codes, links, float16 heads (room included), norms."""
        hnsw = self._graph.hnsw
        links = hnsw.neighbors.size() * 4 + hnsw.offsets.size() * 8  # type: ignore[attr-defined]
        links += hnsw.levels.size() * 4
        storage = faiss.downcast_index(self._graph.storage)
        codes = self._n * storage.code_size  # type: ignore[attr-defined]
        return codes + links + self._heads.nbytes + self._norms.nbytes
