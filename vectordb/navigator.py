"""Navigator: the in-memory head vectors and the index that finds a query's nearest heads.

faiss does the work: an exact flat index while there are few heads, HNSW (M=32) above
``HNSW_ABOVE`` heads. Heads are added when a posting list splits and removed when one splits
or merges away; faiss's flat and HNSW indexes cannot drop entries cheaply, so a removed head is
only marked dead (searches ask for a few more results and skip it) and the index is rebuilt
once a tenth of it is dead.

Distances are the index's internal ones (metric.py): smaller is nearer.
Concurrency: loop thread only; faiss calls release the GIL and use its own OpenMP threads.
"""

from __future__ import annotations

import faiss
import numpy as np

from vectordb.metric import Metric

__all__ = ["HNSW_ABOVE", "Navigator"]

HNSW_ABOVE = 20_000
_HNSW_M = 32


class Navigator:
    def __init__(self, dim: int, metric: Metric, kind: str = "auto") -> None:
        self.dim = dim
        self.metric = metric
        self.kind = kind
        self._index: faiss.Index = self._new_index(0)
        self._pos_pid = np.zeros(0, np.int64)  # faiss position -> pid, -1 once removed
        self._pid_pos: dict[int, int] = {}
        self._dead = 0

    @property
    def n_heads(self) -> int:
        return len(self._pid_pos)

    def _new_index(self, expected: int) -> faiss.Index:
        hnsw = self.kind == "hnsw" or (self.kind == "auto" and expected > HNSW_ABOVE)
        metric = self.metric.faiss_metric
        if hnsw:
            index = faiss.IndexHNSWFlat(self.dim, _HNSW_M, metric)
            index.hnsw.efConstruction = 64
            return index
        return faiss.IndexFlat(self.dim, metric)

    def add(self, vectors: np.ndarray, pids: np.ndarray) -> None:
        """Add heads (prepared float32 vectors) under posting ids ``pids``."""
        if len(pids) == 0:
            return
        start = self._index.ntotal
        self._index.add(np.ascontiguousarray(vectors, np.float32))
        self._pos_pid = np.concatenate([self._pos_pid, np.asarray(pids, np.int64)])
        for offset, pid in enumerate(np.asarray(pids).tolist()):
            self._pid_pos[pid] = start + offset

    def remove(self, pids: list[int]) -> None:
        for pid in pids:
            pos = self._pid_pos.pop(pid)
            self._pos_pid[pos] = -1
            self._dead += 1
        if self._dead > max(64, self._index.ntotal // 10):
            self._rebuild()

    def vectors_of(self, pids: np.ndarray) -> np.ndarray:
        positions = np.array([self._pid_pos[int(p)] for p in np.asarray(pids).tolist()], np.int64)
        if len(positions) == 0:
            return np.zeros((0, self.dim), np.float32)
        return self._index.reconstruct_batch(positions)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(pids int64 [Q, k] padded with -1, internal distances float32 [Q, k]), nearest first."""
        n_queries = len(queries)
        out_pids = np.full((n_queries, k), -1, np.int64)
        out_dist = np.full((n_queries, k), np.inf, np.float32)
        if not self._pid_pos or n_queries == 0:
            return out_pids, out_dist
        want = min(self._index.ntotal, k + self._dead)
        if isinstance(self._index, faiss.IndexHNSW):
            self._index.hnsw.efSearch = max(2 * want, 64)
        dist, pos = self._index.search(np.ascontiguousarray(queries, np.float32), want)
        pids = np.where(pos >= 0, self._pos_pid[np.maximum(pos, 0)], -1)
        if self.metric is not Metric.L2:
            dist = -dist
        if self._dead:
            order = np.argsort(pids < 0, axis=1, kind="stable")  # live ones first, still sorted
            pids = np.take_along_axis(pids, order, axis=1)
            dist = np.take_along_axis(dist, order, axis=1)
        take = min(k, want)
        out_pids[:, :take] = pids[:, :take]
        out_dist[:, :take] = np.where(pids[:, :take] >= 0, dist[:, :take], np.inf)
        return out_pids, out_dist

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """(pids, vectors) of every live head."""
        pids = np.fromiter(self._pid_pos.keys(), np.int64, len(self._pid_pos))
        return pids, self.vectors_of(pids)

    def _rebuild(self) -> None:
        pids, vectors = self.snapshot()
        self._index = self._new_index(len(pids))
        self._pos_pid = np.zeros(0, np.int64)
        self._pid_pos = {}
        self._dead = 0
        self.add(vectors, pids)

    def resident_bytes(self) -> int:
        vectors = self._index.ntotal * self.dim * 4
        links = (
            self._index.ntotal * _HNSW_M * 2 * 4 if isinstance(self._index, faiss.IndexHNSW) else 0
        )
        return vectors + links + self._pos_pid.nbytes + len(self._pid_pos) * 100
